"""The mypyc build: every listed module runs compiled, a stale build is noticed, and the compiled cores
decide exactly what their plain-Python source decides (the scheduler's closed loop, a whole simulation)."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from progrouter import compiled
from progrouter.config import PrefillCostModel
from support.program_loop import ProgramModules, closed_loop
from support.pure import plain_python

TESTS = Path(__file__).resolve().parent
BUILT = os.environ.get("PROGROUTER_COMPILE", "1") != "0"  # what `make compile` was asked for


def _module(source: str) -> str:
    return "progrouter." + source.removesuffix(".py").replace("/", ".")


def test_every_listed_module_runs_compiled_and_current() -> None:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    loaded = {source: importlib.import_module(_module(source)).__file__ or "" for source in compiled.SOURCES}
    runs_compiled = sorted(s for s, path in loaded.items() if path.endswith(suffixes))
    assert runs_compiled == (sorted(compiled.SOURCES) if BUILT else [])
    assert compiled.stale() == []
    assert compiled.up_to_date()[0]


def test_a_source_edited_after_the_build_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "progrouter"
    source = compiled.SOURCES[0]
    (package / source).parent.mkdir(parents=True)
    shutil.copy(compiled.PACKAGE / source, package / source)
    assert compiled.compiled(package) == [] and compiled.stale(package) == []  # nothing built: nothing stale
    extension = (package / source).with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"")
    assert compiled.stale(package) == [source]  # built, but no digest recorded
    (package / compiled.DIGESTS).write_text(json.dumps({source: compiled.digest(package / source)}))
    assert compiled.stale(package) == []
    with (package / source).open("a") as f:
        f.write("\n# edited\n")
    assert compiled.stale(package) == [source]


CHEAP_RECOVERY = {
    "prefill_cost_model": PrefillCostModel(linear_seconds_per_1k_tokens=0.02, intercept_seconds=0.0)
}


@pytest.mark.parametrize(("seed", "fields"), [(1, {}), (2, CHEAP_RECOVERY), (3, {"global_queue": False})])
def test_the_compiled_scheduler_decides_what_its_source_decides(seed: int, fields: dict[str, object]) -> None:
    built = closed_loop(ProgramModules.load(importlib.import_module), seed, **fields)
    with plain_python("progrouter.program") as load:
        source = closed_loop(ProgramModules.load(load), seed, **fields)
    assert len(built) > 1000
    assert built == source


SIMULATE = [
    "simulate", "--generate", "coding", "--tasks", "6", "--turns-min", "3", "--turns-max", "6",
    "--block-size", "16", "--system-prompt-tokens", "512", "--task-prompt-tokens", "256",
    "--tool-result-tokens", "128", "--output-tokens", "16", "--output-tokens-max", "32",
    "--max-context-tokens", "1800", "--subagent-prob", "0.3", "--ranks", "2", "--num-blocks", "128",
    "--arms", "native,program", "--variant", 'rtb={"binding_strategy": "reasoning_token_balance"}',
]  # fmt: skip

PLAIN = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from support.pure import plain_python
with plain_python("progrouter") as load:
    sys.exit(load("progrouter.cli").main(sys.argv[1:]))
"""


@pytest.mark.timeout(180)
def test_a_simulation_on_the_compiled_engine_and_scheduler_reports_what_plain_python_reports(
    tmp_path: Path,
) -> None:
    reports = []
    for name, command in [("built", ["-m", "progrouter"]), ("plain", ["-c", PLAIN])]:
        out = tmp_path / name
        done = subprocess.run(
            [sys.executable, *command, *SIMULATE, "--out", str(out)], capture_output=True, timeout=150
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        reports.append((out / "report.json").read_bytes())
    assert b'"completed_tasks": 6' in reports[0]
    assert reports[0] == reports[1]


def test_the_module_list_loads_with_the_standard_library_alone() -> None:
    """setup.py reads it in the build's environment, before the package or its dependencies exist."""
    probe = f"import runpy; print(len(runpy.run_path({str(compiled.PACKAGE / 'compiled.py')!r})['SOURCES']))"
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(compiled.SOURCES) > 30
