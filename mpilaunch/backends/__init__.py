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

from ..errors import UsageError

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
        extra = options.extra or name
        raise UsageError(
            f"the {name} backend needs the Python package {e.name!r}",
            f"pip install 'mpilaunch[{extra}]'",
        ) from None
