"""The scheduler-core page's module tables name every module of program/ (a new module needs its row)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "src" / "progrouter" / "program"
PAGE = ROOT / "docs" / "explanation" / "scheduler-core.md"


def _unlisted(page: str, modules: list[Path]) -> list[str]:
    return [str(m.relative_to(PROGRAM)) for m in modules if not re.search(rf"[`/]{re.escape(m.name)}`", page)]


def test_every_program_module_has_a_row() -> None:
    modules = [p for p in sorted(PROGRAM.rglob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 30
    assert _unlisted(PAGE.read_text(), modules) == []


def test_a_module_without_a_row_is_found() -> None:
    """The check above can fail: a module the page does not name is reported."""
    assert _unlisted(
        "| `state.py` | Program |", [PROGRAM / "core" / "state.py", PROGRAM / "core" / "x.py"]
    ) == ["core/x.py"]
