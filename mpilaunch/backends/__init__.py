"""Backends are imported lazily: k8s and yarn pull heavy optional clients."""

from __future__ import annotations

import importlib

from ..errors import UsageError

_MODULES = {"local": "local", "k8s": "k8s", "yarn": "yarn"}
_EXTRAS = {"k8s": "k8s", "yarn": "yarn"}


def load(name: str):
    """Backend name -> its Backend class, with an install hint if its extra is missing."""
    if name not in _MODULES:
        raise UsageError(f"unknown backend {name!r}", f"choose one of: {', '.join(_MODULES)}")
    try:
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("mpilaunch"):
            raise UsageError(f"the {name} backend is not available in this version", None) from None
        extra = _EXTRAS.get(name, name)
        raise UsageError(
            f"the {name} backend needs the Python package {e.name!r}",
            f"pip install 'mpilaunch[{extra}]'",
        ) from None
    return module.Backend
