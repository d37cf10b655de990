"""Who may write a Program's state is a property of the types, not a rule a test polices by name.

``Program`` is what every module holds: its identity is ``Final``, its phase and placement are read-only
properties that the table's private ``_Row`` shadows with writable slots, and its ``lifecycle`` is a
``LifecycleRecord`` whose members are read-only properties, written through lifecycle.py's private
``_Record``. mypy rejects any other write. What mypy cannot see is checked here: that the read-only shapes
stay read-only (a new plain attribute would be writable by everyone) and that the two writable classes are
named nowhere but in their owner modules (a module importing one could write through it).
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from progrouter.program.core import lifecycle, records, state, table

SRC = Path(__file__).parents[2] / "src" / "progrouter"
#: each writable class and the one module that may name it
OWNERS = {"_Row": SRC / "program" / "core" / "table.py", "_Record": SRC / "program" / "core" / "lifecycle.py"}


def _properties(cls: type) -> dict[str, property]:
    return {name: value for name, value in vars(cls).items() if isinstance(value, property)}


def test_a_program_is_read_only_and_the_table_row_writes_exactly_its_phase_and_placement() -> None:
    tree = ast.parse(Path(state.__file__ or "").read_text())
    program = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Program")
    init = next(n for n in program.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assigned = [n for n in ast.walk(init) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)]
    assert assigned and all(
        isinstance(n, ast.AnnAssign) and ast.unparse(n.annotation).startswith("Final") for n in assigned
    ), "every attribute Program assigns itself is Final"
    settable = [name for name, prop in _properties(state.Program).items() if prop.fset is not None]
    assert not settable
    shadowed = {name for name in _properties(state.Program) if name in table._Row.__slots__}
    assert shadowed == set(table._Row.__slots__)  # every row slot is a read-only property of Program
    assert set(state.Program.__slots__) == {"ref", "serial", "redacted", "created_at", "lifecycle"}


def test_the_lifecycle_record_is_read_only_and_its_writable_class_has_exactly_its_members() -> None:
    members = _properties(records.LifecycleRecord)
    assert members and all(prop.fset is None for prop in members.values())
    assert not typing.get_type_hints(records.LifecycleRecord)  # no plain (writable) protocol attribute
    assert set(members) == set(lifecycle._Record.__slots__)


def _named(path: Path) -> set[str]:
    """The private writable classes a module names (imported, called, cast to or reached as an attribute)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in OWNERS:
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in OWNERS:
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names if alias.name in OWNERS}
        elif isinstance(node, ast.Constant) and node.value in OWNERS:
            found.add(str(node.value))  # cast("_Row", …)
    return found


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_only_the_owner_module_names_its_writable_class(path: Path) -> None:
    foreign = sorted(name for name in _named(path) if OWNERS[name] != path)
    assert not foreign, f"{path.name} names {foreign}"


def test_the_check_sees_every_way_of_naming_a_writable_class(tmp_path: Path) -> None:
    source = tmp_path / "intruder.py"
    source.write_text(
        "from progrouter.program.core.table import _Row\n"
        "import progrouter.program.core.lifecycle as lc\n"
        "def f(p):\n"
        "    lc._Record.__init__(p.lifecycle, None, 0, None)\n"
        "    return typing.cast('_Row', p)\n"
    )
    assert _named(source) == {"_Row", "_Record"}
