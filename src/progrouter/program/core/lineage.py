"""The model-scoped parent/root forest of Programs (upstream ``lineage.rs``); diagnostics only.

Each Program points at its declared parent or root; the forest is a directed union-find. A link that would
close a cycle is refused (the Program keeps its previous link), and root lookups compress the path they walk,
so repeated lookups stay short. It grants no scheduling privilege: it only answers "which root does this
Program belong to" for diagnostics. Keys are (model_pool, program_id): equal ids of different models never
meet. Only live Programs have an entry (``forget`` on release), so the forest is as large as the Program
table: a declared parent or root that is not live is just a name, and a walk ends at it.
"""

from __future__ import annotations

_Key = tuple[str, str]  # (model_pool, program_id)


class ProgramLineage:
    """Parent forest with lazy root resolution."""

    __slots__ = ("_parents",)

    def __init__(self) -> None:
        self._parents: dict[_Key, _Key] = {}

    def __len__(self) -> int:
        return len(self._parents)

    def observe(
        self,
        model_pool: str,
        program_id: str,
        parent_program_id: str | None = None,
        root_program_id: str | None = None,
    ) -> str:
        """Record a Program's declared parent and root (the root wins if both are given); return its root."""
        self.link(model_pool, program_id, parent_program_id, root_program_id)
        return self.root(model_pool, program_id)

    def link(
        self,
        model_pool: str,
        program_id: str,
        parent_program_id: str | None = None,
        root_program_id: str | None = None,
    ) -> None:
        """``observe`` without looking the root up (a request's arrival records the links only)."""
        program = (model_pool, program_id)
        self._parents.setdefault(program, program)
        if parent_program_id is None and root_program_id is None:
            return  # the common request: nothing declared, nothing to check
        for related in (parent_program_id, root_program_id):
            if related is None or related == program_id:
                continue
            link = (model_pool, related)
            if not self._would_cycle(program, link):
                self._parents[program] = link

    def root(self, model_pool: str, program_id: str) -> str:
        """The Program's root, compressing the walked path to point straight at it."""
        path: list[_Key] = []
        current = (model_pool, program_id)
        while (parent := self._parents.get(current, current)) != current:
            path.append(current)
            current = parent
        for node in path:
            self._parents[node] = current
        return current[1]

    def forget(self, model_pool: str, program_id: str) -> None:
        """A released Program leaves the forest; links to it still end at its name."""
        self._parents.pop((model_pool, program_id), None)

    def root_readonly(self, model_pool: str, program_id: str) -> str:
        """The Program's root without touching the forest (for snapshots); itself when unknown."""
        current = (model_pool, program_id)
        for _ in range(len(self._parents) + 1):
            parent = self._parents.get(current)
            if parent is None or parent == current:
                break
            current = parent
        return current[1]

    def _would_cycle(self, child: _Key, proposed_parent: _Key) -> bool:
        current = proposed_parent
        for _ in range(len(self._parents) + 1):
            if current == child:
                return True
            parent = self._parents.get(current)
            if parent is None or parent == current:
                return False
            current = parent
        return True
