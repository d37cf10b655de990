"""The settings reference page, generated from the configuration models (docs/reference/settings.md).

Each row is one field: its key, flag and environment variable, type, default, bounds, origin and
description, read from the same declaration ``progrouter serve --help`` is built from, so the page
cannot drift from the command line. Regenerate it with ``make docs-reference``, i.e.
``python -m progrouter.settings_doc > docs/reference/settings.md``; a test fails while it is stale.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import Enum
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.config_cli import (
    argument_options,
    choices,
    default_value,
    extra,
    flag_name,
    groups,
    value_type,
)
from progrouter.epp.cli import EppFlags
from progrouter.server.cli import ProgramSchedulingFlags
from progrouter.server.settings import ENV_PREFIX

PAGE = "docs/reference/settings.md"
_BOUND_KEYWORDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
_BOUND_TYPES = (
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "<="),
    (annotated_types.Lt, "lt", "<"),
)

HEADER = f"""# Settings reference

<!-- Generated from the settings models by `make docs-reference`: edit their fields
(src/progrouter/config.py; the command-line-only flags in src/progrouter/server/cli.py and
src/progrouter/epp/cli.py), never this page. -->

Every router setting can be given three ways: a flag of `progrouter serve` (and of `progrouter epp`), an
environment variable `{ENV_PREFIX}<KEY>`, or a key of the YAML or JSON file named by `--config FILE`. A flag
wins over the environment, which wins over the file; a setting given nowhere takes its default. In the
environment, lists and objects are JSON (`{ENV_PREFIX}WORKER_URLS='["http://w1:8000", "http://w2:8000"]'`).
An unknown key in the file is an error that names it.

*Origin* `upstream` means the setting is vllm-router 0.1.17's, with its flag, default and meaning, so a
command line written for it means the same here; `beyond upstream` settings are progrouter's own.
`--version` prints the version; the vllm-router flags of features progrouter does not have (PD
disaggregation, WASM middleware, IGW, Kubernetes discovery) end startup with one line naming the flag.
"""

PROGRAM_INTRO = f"""## Program scheduling keys

Program scheduling is off unless one of these turns it on: `--enable-program-scheduling` (the keys then go
in the JSON object of `--program-scheduling-config-json`), a `program_scheduling:` mapping of the keys in the
config file, or that mapping as JSON in `{ENV_PREFIX}PROGRAM_SCHEDULING`. The command line's replaces the
environment's, which replaces the file's, as a whole. Omitted keys take their defaults, an unknown key is an
error that names it, and numbers must be finite.

*Origin* `spec` means the key, default and bounds are the product specification's; `beyond the spec` keys
are progrouter's additions, and their defaults keep the specification's behaviour. The two cost models'
coefficients come from `progrouter calibrate` ([Calibrate on your GPUs](../guides/calibrate.md)).
"""


def bounds_of(field: FieldInfo) -> list[tuple[str, float]]:
    """A field's bounds as (operator, value): its ``Field`` constraints and those its validator declares."""
    out: list[tuple[str, float]] = []
    for constraint in field.metadata:
        for kind, attribute, operator in _BOUND_TYPES:
            if isinstance(constraint, kind):
                out.append((operator, getattr(constraint, attribute)))
    meta = extra(field)
    out.extend((operator, meta[key]) for key, operator in _BOUND_KEYWORDS if key in meta)
    return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _bounds_text(field: FieldInfo) -> str:
    return ", ".join(f"{operator} {_number(value)}" for operator, value in bounds_of(field))


def _type_text(annotation: Any) -> str:
    kind = value_type(annotation)
    text: str
    if get_origin(kind) in (Union, UnionType):  # a number or named words: ``int | Literal["auto"]``
        members = [a for a in get_args(kind) if a is not type(None)]
        text = ", ".join(
            " or ".join(f'`"{v}"`' for v in get_args(a)) if get_origin(a) is Literal else _type_text(a)
            for a in members
        )
        return text + (" or null" if len(members) < len(get_args(kind)) else "")
    elif (values := choices(kind)) is not None:
        text = "one of " + ", ".join(f"`{v}`" for v in values)
    elif get_origin(kind) is list:
        text = "list of strings"
    elif get_origin(kind) is dict:
        text = "object (string to string)"
    elif isinstance(kind, type) and issubclass(kind, BaseModel):
        text = "object"
    else:
        text = {bool: "bool", int: "integer", float: "number", str: "string"}[kind]
    return text + (" or null" if kind is not annotation else "")


def _default_text(field: FieldInfo) -> str:
    value = default_value(field)
    if isinstance(value, BaseModel):
        return "(the keys below)"
    if isinstance(value, Enum):
        value = value.value
    return f"`{json.dumps(to_jsonable_python(value))}`"


def _cell(text: str) -> str:
    """Text that stays one Markdown table cell and renders as written."""
    for raw, escaped in (("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*")):
        text = text.replace(raw, escaped)
    return text


def _meaning(field: FieldInfo) -> str:
    text = _cell(field.description or "")
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        others = [str(a) for a in alias.choices if a != alias.choices[0]]
        text += "; also accepted as " + ", ".join(f"`{a}`" for a in others)
    return text


def _flag_text(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    """The flag as typed: ``--x`` (repeatable), ``--x`` with several values, a switch that sets false."""
    flag = flag_name(name, field)
    if flag is None:
        return "(file, environment)"
    options = argument_options(model, name, field)
    if options.get("action") == "append":
        return f"`{flag}` (repeatable)"
    if options.get("nargs") == "*":
        return f"`{flag} VALUE ...`"
    if options.get("action") == "store_false":
        return f"`{flag}` (sets false)"
    return f"`{flag}`"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def router_sections() -> Iterator[str]:
    """One table per group of ``RouterConfig``."""
    for title, fields in groups(RouterConfig):
        yield f"### {title or 'Other settings'}\n"
        rows = [_row(["Key", "Flag", "Environment", "Type", "Default", "Bounds", "Origin", "Meaning"])]
        rows.append(_row(["---"] * 8))
        for name, field in fields:
            origin = "beyond upstream" if extra(field).get("x-beyond") == "upstream" else "upstream"
            flag = _flag_text(RouterConfig, name, field)
            variable = f"`{ENV_PREFIX}{name.upper()}`"
            kind, default, bounds = _type_text(field.annotation), _default_text(field), _bounds_text(field)
            rows.append(_row([f"`{name}`", flag, variable, kind, default, bounds, origin, _meaning(field)]))
        yield "\n".join(rows) + "\n"


def flag_rows(model: type[BaseModel]) -> Iterator[str]:
    """A table of flags that are not router settings (no environment variable, no file key)."""
    yield _row(["Flag", "Type", "Default", "Bounds", "Meaning"])
    yield _row(["---"] * 5)
    for name, field in model.model_fields.items():
        flag, kind = _flag_text(model, name, field), _type_text(field.annotation)
        yield _row([flag, kind, _default_text(field), _bounds_text(field), _meaning(field)])


def program_rows(model: type[BaseModel] = ProgramSchedulingConfig, prefix: str = "") -> Iterator[str]:
    if not prefix:
        yield _row(["Key", "Type", "Default", "Bounds", "Origin", "Meaning"])
        yield _row(["---"] * 6)
    for name, field in model.model_fields.items():
        origin = "beyond the spec" if extra(field).get("x-beyond") == "spec" else "spec"
        kind = field.annotation
        yield _row([
            f"`{prefix}{name}`",
            _type_text(kind),
            _default_text(field),
            _bounds_text(field),
            origin,
            _meaning(field),
        ])  # fmt: skip
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from program_rows(kind, f"{prefix}{name}.")


def render() -> str:
    """The whole page."""
    parts = [
        HEADER,
        "## Router settings\n",
        *router_sections(),
        "## Program scheduling on the command line\n",
        "Upstream's switch and its JSON; `--config FILE` names the settings file.\n",
        "\n".join(flag_rows(ProgramSchedulingFlags)) + "\n",
        "## `progrouter epp`\n",
        "The endpoint picker takes every router setting above (`--host`/`--port` are its gRPC listener), "
        "and these flags of its own.\n",
        "\n".join(flag_rows(EppFlags)) + "\n",
        PROGRAM_INTRO,
        "\n".join(program_rows()) + "\n",
    ]
    return "\n".join(parts)


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
