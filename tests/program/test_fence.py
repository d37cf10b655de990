"""The fence around Program state: every ``Program`` field is written only by its owner (``FIELD_OWNERS``).

The check reads the source: an assignment, augmented assignment or ``del`` whose target is an attribute named
like a Program field (or an item of one, like ``completions[kind]``), or a mutating call on such an attribute,
counts as a write by the module it is in. Writes through ``self`` are a class's own attributes, not a
Program's, and are left out (``Program`` has no method that writes).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from progrouter.program.core.state import FIELD_OWNERS, Program

PROGRAM = Path(__file__).parents[2] / "src" / "progrouter" / "program"
MUTATORS = {"pop", "clear", "update", "setdefault", "popitem", "append", "extend", "remove", "add", "discard"}
#: set once at construction, never written afterwards
CONSTRUCTED = {"ref", "serial", "redacted", "created_at", "lifecycle"}


def _attribute_written(node: ast.AST) -> str | None:
    """The Program-field name a write target touches, if any."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return None
    return node.attr if node.attr in FIELD_OWNERS or node.attr in CONSTRUCTED else None


def writes(source: str) -> list[tuple[int, str]]:
    """(line, field) of every write to a Program field in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        flat: list[ast.AST] = []
        for target in targets:
            flat.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        for target in flat:
            name = _attribute_written(target)
            if name is not None:
                found.append((node.lineno, name))
    return found


def test_every_program_field_has_one_owner() -> None:
    fields = {f.name for f in dataclasses.fields(Program)}
    assert set(FIELD_OWNERS) == fields - CONSTRUCTED
    assert all(any(PROGRAM.rglob(f"{owner}.py")) for owner in FIELD_OWNERS.values())


@pytest.mark.parametrize("path", sorted(PROGRAM.rglob("*.py")), ids=lambda p: str(p.relative_to(PROGRAM)))
def test_only_the_owner_writes_a_program_field(path: Path) -> None:
    module = path.stem
    foreign = [
        f"{path.name}:{line} writes {name} (owner: {FIELD_OWNERS.get(name, 'nobody after construction')})"
        for line, name in writes(path.read_text())
        if FIELD_OWNERS.get(name) != module
    ]
    assert not foreign, foreign


def test_the_fence_catches_writes_from_outside() -> None:
    source = (
        "def f(program, kind):\n"
        "    program.placement = None\n"
        "    program.status, x = None, 1\n"
        "    program.in_flight += 1\n"
        "    del program.lifecycle[kind]\n"
        "    program.lifecycle.pop(kind)\n"
        "    self.state = 1\n"
    )
    assert writes(source) == [
        (2, "placement"),
        (3, "status"),
        (4, "in_flight"),
        (5, "lifecycle"),
        (6, "lifecycle"),
    ]
