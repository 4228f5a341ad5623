"""The backend registry: one line per backend, naming its options class.

A backend lives in its own folder (``backends/<name>/``); what the command
line, the lifecycle and ``manage`` need of it goes through this registry.
Third-party backends register the same way through the entry-point group
``mpilaunch.backends`` (``name = "package.module:OptionsClass"``).

Options classes are light (dataclasses, argparse); the backend classes they
name are imported only for a job that runs on them, since k8s and yarn pull
heavy optional clients.
"""

from __future__ import annotations

import importlib

from ..core.errors import UsageError

# name -> "module:OptionsClass"
BUILTIN = {
    "local": "mpilaunch.backends.local.options:LocalOptions",
    "k8s": "mpilaunch.backends.k8s.options:K8sOptions",
    "yarn": "mpilaunch.backends.yarn.options:YarnOptions",
    "ssh": "mpilaunch.backends.ssh.options:SshOptions",
}
ENTRY_POINT_GROUP = "mpilaunch.backends"

_installed: dict[str, str] | None = None


def installed() -> dict[str, str]:
    """Backends of installed packages (entry points). Read only when asked for: importing
    importlib.metadata and scanning every installed distribution costs ~20 ms, which a launch
    on a built-in backend does not pay."""
    global _installed
    if _installed is None:
        from importlib.metadata import entry_points

        # a package may not shadow a built-in backend
        _installed = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN}
    return _installed


def registered() -> dict[str, str]:
    """Every backend: the built-in ones, then those of installed packages."""
    return {**BUILTIN, **installed()}


def names() -> tuple[str, ...]:
    return tuple(registered())


def _import(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _unknown(name: str) -> UsageError:
    return UsageError(f"unknown backend {name!r}", f"choose one of: {', '.join(names())}")


def options_class(name: str):
    """Backend name -> its options class (light: no cluster client is imported)."""
    path = BUILTIN.get(name) or installed().get(name)
    if path is None:
        raise _unknown(name)
    return _import(path)


def load(name: str):
    """Backend name -> its backend class, with an install hint if its extra is missing."""
    options = options_class(name)
    try:
        return _import(options.backend_class)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("mpilaunch"):
            raise UsageError(f"the {name} backend is not available in this version", None) from None
        own = options.backend_class.split(".")[0]  # a third-party backend's own package
        raise missing_module_error(name, options.extra or name, e, own) from None


# Modules that newer Pythons removed and that a backend's client package may still import,
# with what brings them back. skein 0.8.2 (the yarn extra's) imports distutils, which
# Python 3.12 removed; setuptools puts it back (its distutils-precedence.pth).
_REMOVED_FROM_PYTHON = {"distutils": ("Python 3.12 removed it", "pip install setuptools")}


def missing_module_error(backend: str, extra: str, error: ModuleNotFoundError, own: str = "mpilaunch") -> UsageError:
    """One line for a backend whose import stopped at a missing module: the package that needs it
    when that is an installed dependency of the backend (its own import failed), else the module.
    ``own``: the backend's own top-level package, whose imports are the backend's."""
    importer = failing_package(error)
    if importer in (None, own, error.name):
        return UsageError(
            f"the {backend} backend needs the Python package {error.name!r}", f"pip install 'mpilaunch[{extra}]'"
        )
    missing = (error.name or "?").split(".")[0]  # `from distutils.version import ...` may name the submodule
    why, fix = _REMOVED_FROM_PYTHON.get(missing, ("not installed", f"pip install 'mpilaunch[{extra}]'"))
    return UsageError(
        f"the {backend} backend's package {importer!r} cannot be imported: it needs the module {missing!r} ({why})", fix
    )


def failing_package(error: ImportError) -> str | None:
    """The top-level package whose code ran the import that failed: the innermost frame of the
    traceback (the interpreter leaves its import machinery's frames out of it); None for mpilaunch's."""
    tb, module = error.__traceback__, None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__") or module
        tb = tb.tb_next
    package = (module or "").split(".")[0]
    return None if package in ("", "mpilaunch", "__main__") else package
