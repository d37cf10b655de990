"""One declaration per setting: the field drives `serve --help` and docs/reference/settings.md alike, and what
the page states (bounds, environment variable names) is what the router enforces and reads."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from types import UnionType
from typing import Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from progrouter.config import DecodeThroughputModel, PrefillCostModel, ProgramSchedulingConfig, RouterConfig
from progrouter.config_cli import add_model_arguments, default_value, value_type
from progrouter.epp.cli import EppFlags
from progrouter.server.cli import ProgramSchedulingFlags, add_arguments
from progrouter.server.settings import read_environment
from progrouter.settings_doc import PAGE, bounds_of, render

ROOT = Path(__file__).resolve().parents[1]
MODELS: tuple[type[BaseModel], ...] = (
    RouterConfig,
    ProgramSchedulingConfig,
    PrefillCostModel,
    DecodeThroughputModel,
    EppFlags,
    ProgramSchedulingFlags,
)


def _help() -> str:
    parser = argparse.ArgumentParser(prog="progrouter serve")
    add_arguments(parser)
    return " ".join(parser.format_help().split())


def test_the_committed_reference_is_the_generated_one() -> None:
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    assert render() == committed, "stale: run `make docs-reference`"
    done = subprocess.run(
        [sys.executable, "-m", "progrouter.settings_doc"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == committed


def test_a_description_moves_both_the_help_and_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    router_text = "prefix share a worker must match before cache_aware prefers it"
    program_text = "the RequestPool's longest wait for one request"
    assert router_text not in _help() and router_text not in render()
    monkeypatch.setattr(RouterConfig.model_fields["cache_threshold"], "description", router_text)
    monkeypatch.setattr(
        ProgramSchedulingConfig.model_fields["queue_timeout_seconds"], "description", program_text
    )
    assert f"--cache-threshold CACHE_THRESHOLD {router_text} (default: 0.3)" in _help()
    page = render()
    assert (
        f"| `PROGROUTER_CACHE_THRESHOLD` | number | `0.3` | >= 0, <= 1 | upstream | {router_text} |" in page
    )
    assert f"| `queue_timeout_seconds` | number | `600.0` | > 0 | spec | {program_text} |" in page


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_setting_says_what_it_does(model: type[BaseModel]) -> None:
    assert [name for name, field in model.model_fields.items() if not field.description] == []


def test_a_setting_no_flag_can_carry_must_say_so() -> None:
    class WithObject(BaseModel):
        routes: dict[str, str] = {}

    with pytest.raises(TypeError, match=r"WithObject\.routes.*no_flag"):
        add_model_arguments(argparse.ArgumentParser(), WithObject)


def _outside(operator: str, bound: float, kind: type) -> float:
    step = 1 if kind is int else 1e-9 * max(1.0, abs(bound))
    return {">=": bound - step, ">": bound, "<=": bound + step, "<": bound}[operator]


def _validate(model: type[BaseModel], name: str, value: float) -> None:
    """``model`` with field ``name`` set, built the way a config file sets it."""
    if model is PrefillCostModel:
        ProgramSchedulingConfig.model_validate({"prefill_cost_model": {name: value}})
    elif model is DecodeThroughputModel:
        ProgramSchedulingConfig.model_validate({"decode_throughput_model": {name: value}})
    else:
        model.model_validate({name: value})


BOUNDED = [
    pytest.param(model, name, operator, bound, id=f"{model.__name__}.{name}{operator}{bound}")
    for model in MODELS[:5]
    for name, field in model.model_fields.items()
    for operator, bound in bounds_of(field)
]


@pytest.mark.parametrize(("model", "name", "operator", "bound"), BOUNDED)
def test_a_documented_bound_is_enforced(
    model: type[BaseModel], name: str, operator: str, bound: float
) -> None:
    kind = value_type(model.model_fields[name].annotation)
    if get_origin(kind) in (Union, UnionType):  # a number or named words: the bound is the number's
        kind = next(a for a in get_args(kind) if a in (int, float))
    with pytest.raises(ValidationError):
        _validate(model, name, kind(_outside(operator, bound, kind)))
    if operator in (">=", "<="):
        _validate(model, name, kind(bound))  # the bound itself is allowed


def test_the_documented_environment_variables_are_the_ones_read() -> None:
    router_table = render().split("## Router settings")[1].split("\n## ")[0]
    documented = re.findall(r"`(PROGROUTER_[A-Z0-9_]+)`", router_table)
    assert len(documented) == len(RouterConfig.model_fields)
    for variable, (name, field) in zip(documented, RouterConfig.model_fields.items(), strict=True):
        value = default_value(field)
        text = value if isinstance(value, str) else json.dumps(to_jsonable_python(value) or "x")
        assert set(read_environment({variable: text, "PROGROUTER_": "x", "OTHER": "y"})) == {name}
