"""Options declared once: a run option is one dataclass field, and its command-line flag, type,
default, choices, help and place in a detached job are that field's declaration (``option``).

From the declarations come the parser's arguments (``add_arguments``) and the value objects built
from the parsed arguments (``from_args``), for the job's spec (core/spec.py), the PS options and
each backend's options (backends/<name>/options.py): a new option is one field, nothing else to
keep in step (skein's model and dask-gateway's backends declare theirs the same way).
"""

from __future__ import annotations

import dataclasses

# Where each field goes when the job is detached (``--detach``): the in-cluster launcher runs the
# job from a LaunchDescription, and a field it never sees is an option silently dropped
# (--stall-timeout once was). Every field says which of these it is; test_detach_option holds
# every field (the job spec's and every backend's options') to it.
CARRIED = "carried"  # reaches the detached launcher unchanged (launch_description.carried_spec)
RESOLVED = "resolved"  # the submitting side resolves it into its own description field (-x values, the name)
SUBMITTING = "submitting"  # spent on the submitting side before the hand-off (the plan, the objects made)
REFUSED = "refused"  # needs this mpilaunch to stay: refused with --detach (its flag named)
DETACHED = (CARRIED, RESOLVED, SUBMITTING, REFUSED)

_MISSING = dataclasses.MISSING


def option(
    default=None,
    *,
    detached: str,
    flag: str | tuple[str, ...] | None = None,
    help=None,
    group: str | None = None,
    type=None,
    choices=None,
    metavar: str | None = None,
    action: str | None = None,
    parser_default=_MISSING,
    from_args=None,
    nested=None,
    default_factory=_MISSING,
):
    """A field and everything about it as an option.

    ``default``: ``dataclasses.MISSING`` for a field every instance is given (the command).
    ``flag``: its option string(s) (``"--np"``, ``("-r", "--cluster-requirement")``); none: not an
    option of its own (the command, or ``nested``: a value object whose own fields are the options,
    its ``flag`` then only names it in messages). The parsed value lands in the field's name.
    ``help``: a string, or a function of the parser's context (``build_parser``'s ``context``:
    what is known only when the parser is built, such as the registered backends).
    ``action``: argparse's; a bool field defaults to ``store_true`` (``store_false`` for a
    ``--no-...`` flag). ``parser_default``: the parser's default where it is not the field's (a
    function: asked each time a parser is built, e.g. an environment variable).
    ``from_args(value, args)``: the field's value from the parsed one where it is not that value
    itself (a list is always made a tuple). ``detached``: one of ``DETACHED``.
    """
    if detached not in DETACHED:
        raise ValueError(f"detached= must be one of {DETACHED}, got {detached!r}")
    flags = (flag,) if isinstance(flag, str) else tuple(flag or ())
    metadata = {
        "detached": detached,
        "flag": flags[-1] if flags else None,  # the long form, named in messages
        "flags": () if nested is not None else flags,
        "help": help,
        "group": group,
        "argparse": {
            k: v for k, v in (("type", type), ("choices", choices), ("metavar", metavar), ("action", action)) if v
        },
        "parser_default": parser_default,
        "from_args": from_args,
        "nested": nested,
    }
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def detached_kind(spec_field: dataclasses.Field) -> str | None:
    """Where the field goes with --detach; None for a field declared without ``option`` (a backend
    from another package, whose options class is a plain dataclass: its own capabilities decide)."""
    return spec_field.metadata.get("detached")


def field_default(spec_field: dataclasses.Field):
    if spec_field.default_factory is not _MISSING:
        return spec_field.default_factory()
    return spec_field.default


def declared(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are options (a flag of their own), nested classes' included."""
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested") is not None:
            out += declared(f.metadata["nested"])
        elif f.metadata.get("flags"):
            out.append(f)
    return out


def argument(spec_field: dataclasses.Field, context: dict | None = None) -> tuple[tuple[str, ...], dict]:
    """``add_argument``'s flags and keywords for one declared field."""
    meta = spec_field.metadata
    kwargs = dict(meta["argparse"], dest=spec_field.name)
    default = meta["parser_default"]
    default = field_default(spec_field) if default is _MISSING else default
    default = default() if callable(default) else default
    if isinstance(default, bool) and "action" not in kwargs:
        kwargs["action"] = "store_false" if meta["flags"][-1].startswith("--no-") else "store_true"
    if kwargs.get("action") == "append":
        default = None if default is None else list(default)  # argparse appends to a copy of a list
    kwargs["default"] = default
    help_text = meta["help"]
    kwargs["help"] = help_text(context or {}) if callable(help_text) else help_text
    return meta["flags"], kwargs


def add_arguments(cls, groups, context: dict | None = None, only=None) -> None:
    """Add the options ``cls`` declares: to ``groups`` (a parser or an argument group), or, where
    it is a dict, to ``groups[field's group]``; ``only``: these fields alone."""
    for spec_field in declared(cls):
        if only is not None and spec_field.name not in only:
            continue
        group = groups[spec_field.metadata["group"]] if isinstance(groups, dict) else groups
        flags, kwargs = argument(spec_field, context)
        group.add_argument(*flags, **kwargs)


def from_args(cls, args, **given):
    """An instance of ``cls`` from parsed arguments: each declared field from the argument of its
    name (left at its default where the parser has none), a nested class's from its own, and
    ``given`` what the arguments do not hold (the command after ``--``, ...)."""
    values = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if f.name in given:
            continue
        if meta.get("nested") is not None:
            values[f.name] = from_args(meta["nested"], args)
            continue
        if not meta.get("flags") or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        value = tuple(value) if isinstance(value, list) else value
        if meta["from_args"] is not None:
            value = meta["from_args"](value, args)
        values[f.name] = value
    return cls(**given, **values)


def refused_with_detach(spec) -> list[tuple[str, str, object]]:
    """(field, flag, value) of each option given that a detached job cannot honour: the spec's (a
    nested value object's by its own fields' flags: -i, not --ps) and its backend's options'."""
    out = []
    for holder in (spec, spec.backend_options):
        for spec_field in dataclasses.fields(holder) if dataclasses.is_dataclass(holder) else ():
            value = getattr(holder, spec_field.name)
            if detached_kind(spec_field) != REFUSED or value == field_default(spec_field):
                continue
            if spec_field.metadata.get("nested") is not None:
                out += [
                    (f.name, f.metadata["flag"], getattr(value, f.name))
                    for f in dataclasses.fields(value)
                    if getattr(value, f.name) != field_default(f)
                ]
            else:
                out.append((spec_field.name, spec_field.metadata["flag"], value))
    return out
