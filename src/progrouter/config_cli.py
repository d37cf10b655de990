"""Command-line flags generated from a settings model, so each setting is declared once (its field).

A field's flag is ``--<field-name>`` with dashes (or the ``flag`` of its ``config.setting``), its help the
field's description with the default appended, and its type, choices and nargs come from the annotation:
``bool`` is a switch, ``int``/``float`` convert, an ``Enum`` or ``Literal`` gives the choices, a list takes
several values (or repeats, with ``action="append"``). A field no flag can carry (an object) must say
``no_flag``, so a new setting never silently lacks one. Flags have no argparse default: what was not
typed comes from the environment, the config file or the model.
"""

from __future__ import annotations

import argparse
import types
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def extra(field: FieldInfo) -> dict[str, Any]:
    """The ``config.setting`` declarations of a field (empty when it has none)."""
    value = field.json_schema_extra
    return dict(value) if isinstance(value, dict) else {}


def flag_name(name: str, field: FieldInfo) -> str | None:
    """The flag that sets field ``name``, or None for a setting of the file and environment only."""
    meta = extra(field)
    if meta.get("x-no-flag"):
        return None
    return str(meta.get("x-flag") or "--" + name.replace("_", "-"))


def default_value(field: FieldInfo) -> Any:
    return field.get_default(call_default_factory=True)


def default_text(value: Any) -> str:
    """A default as ``--help`` shows it: 600 (not 600.0), an enum's value, None."""
    if value is None:
        return "None"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def value_type(annotation: Any) -> Any:
    """The annotation without ``| None``."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def choices(annotation: Any) -> list[str] | None:
    """The values an ``Enum`` or ``Literal`` setting accepts, in declaration order."""
    kind = value_type(annotation)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return [str(member.value) for member in kind]
    if get_origin(kind) is Literal:
        return [str(v) for v in get_args(kind)]
    return None


def argument_options(model: type[BaseModel], name: str, field: FieldInfo) -> dict[str, Any]:
    """The ``add_argument`` keywords of one field's flag (all but its name)."""
    meta = extra(field)
    kind = value_type(field.annotation)
    description = (field.description or "").replace("%", "%%")
    shown = default_text(default_value(field)).replace("%", "%%")
    options: dict[str, Any] = {
        "dest": name,
        "default": argparse.SUPPRESS,
        "help": f"{description} (default: {shown})",
    }
    if "x-metavar" in meta:
        options["metavar"] = meta["x-metavar"]
    action = meta.get("x-flag-action")
    if kind is bool:
        options["action"] = action or "store_true"
    elif (values := choices(kind)) is not None:
        options["choices"] = values
    elif get_origin(kind) is list and get_args(kind) == (str,):
        if action == "append":
            options["action"] = "append"
        else:
            options["nargs"] = "*"
    elif kind in (int, float, str):
        if kind is not str and not meta.get("x-flag-text"):
            options["type"] = kind
    else:
        raise TypeError(
            f"{model.__name__}.{name}: no flag carries {field.annotation!r}; declare setting(no_flag=True)"
        )
    return options


def groups(model: type[BaseModel]) -> list[tuple[str | None, list[tuple[str, FieldInfo]]]]:
    """The fields of ``model`` in order, grouped: a field that declares a ``group`` opens it, the fields
    after it belong to it until the next one opens another (None: the fields before the first)."""
    out: list[tuple[str | None, list[tuple[str, FieldInfo]]]] = [(None, [])]
    for name, field in model.model_fields.items():
        if "x-group" in (meta := extra(field)):
            out.append((str(meta["x-group"]), []))
        out[-1][1].append((name, field))
    return [(title, fields) for title, fields in out if fields]


def add_model_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of ``model`` that has one, in field order and in its field's group."""
    for title, fields in groups(model):
        target = parser if title is None else parser.add_argument_group(title)
        for name, field in fields:
            flag = flag_name(name, field)
            if flag is not None:
                target.add_argument(flag, **argument_options(model, name, field))
