"""The plain-Python modules of compiled packages, loaded fresh in this process beside the compiled ones.

Two kinds of test need them: a test that swaps a function inside the scheduler to compare two ways of
deciding (a compiled module calls its own functions directly, so a swapped attribute would go unseen), and
the test that the compiled build decides exactly what its source decides. Inside ``plain_python`` the
packages named are imported from their ``.py`` files as new module objects; on leaving, the compiled ones
are back in ``sys.modules`` and in their parents' attributes. Values from the two worlds must not mix: a
class loaded here is not the compiled class of the same name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the named packages' modules as source files, never as extension modules."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self._packages = packages

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _inside(fullname, self._packages):
            return None
        leaf = fullname.rpartition(".")[2]
        for directory in path or sys.path:
            base = Path(directory) / leaf
            if (base / "__init__.py").exists():
                return importlib.util.spec_from_file_location(
                    fullname, base / "__init__.py", submodule_search_locations=[str(base)]
                )
            if base.with_suffix(".py").exists():
                return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
        return None


def _inside(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@contextmanager
def plain_python(*packages: str) -> Iterator[Callable[[str], ModuleType]]:
    """Yield an importer of the plain-Python modules of ``packages`` (and of what they import of them)."""
    saved = {name: module for name, module in sys.modules.items() if _inside(name, packages)}
    for name in saved:
        del sys.modules[name]
    finder = _SourceFirst(packages)
    sys.meta_path.insert(0, finder)

    def load(name: str) -> ModuleType:
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".py"), module.__file__
        return module

    try:
        yield load
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if _inside(name, packages)]:
            del sys.modules[name]
        sys.modules.update(saved)
        for name, module in saved.items():  # the parents' attributes point at the compiled modules again
            parent, _, leaf = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], leaf, module)
