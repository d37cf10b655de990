"""Who may write a Program's state is a property of the types, not a rule a test polices by name.

``Program`` is what every module holds: its identity is ``Final``, its phase and placement are read-only
properties that the table's private ``_Row`` shadows with writable slots, and its ``lifecycle`` is a
``LifecycleRecord`` whose members are read-only properties, which lifecycle.py's private ``_Record``
shadows with writable slots. mypy rejects any other write. What mypy cannot see is checked here: that the
read-only shapes stay read-only (a new plain attribute would be writable by everyone) and that the two
writable classes are named nowhere but in their owner modules (a module importing one could write through
it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[2] / "src" / "progrouter"
#: each writable class and the one module that may name it
OWNERS = {"_Row": SRC / "program" / "core" / "table.py", "_Record": SRC / "program" / "core" / "lifecycle.py"}


def _class(path: Path, name: str) -> ast.ClassDef:
    """A class of a module, from its source (compiled, a native class shows no ``property`` objects)."""
    return next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)


def _properties(cls: ast.ClassDef) -> set[str]:
    """The read-only properties a class declares (a setter or deleter of one fails here)."""
    found = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            assert not [d for d in decorators if d.endswith((".setter", ".deleter"))], node.name
            if "property" in decorators:
                found.add(node.name)
    return found


def _slots(cls: ast.ClassDef) -> set[str]:
    slots = next(
        n for n in cls.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__slots__"
    )
    return set(ast.literal_eval(slots.value))


def test_a_program_is_read_only_and_the_table_row_writes_exactly_its_phase_and_placement() -> None:
    program = _class(SRC / "program" / "core" / "state.py", "Program")
    init = next(n for n in program.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assigned = [n for n in ast.walk(init) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)]
    assert assigned and all(
        isinstance(n, ast.AnnAssign) and ast.unparse(n.annotation).startswith("Final") for n in assigned
    ), "every attribute Program assigns itself is Final"
    assert _slots(program) == {"ref", "serial", "redacted", "created_at", "lifecycle"}
    row = _slots(_class(OWNERS["_Row"], "_Row"))
    assert row and row <= _properties(program)  # every row slot shadows a read-only property of Program


def test_the_lifecycle_record_is_read_only_and_its_writable_class_has_exactly_its_members() -> None:
    shape = _class(SRC / "program" / "core" / "records.py", "LifecycleRecord")
    members = _properties(shape)
    assert members and _slots(shape) == set()  # no attribute of its own: nothing but read-only properties
    assert members == _slots(_class(OWNERS["_Record"], "_Record"))


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
