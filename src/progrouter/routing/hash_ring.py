"""A consistent-hash ring over target ids, shared by the native consistent_hash policy and Program binding.

Each target owns ``virtual_nodes`` points ``stable_hash64("<target_id>:<vnode>")``; a key goes to the first
point at or after ``stable_hash64(key)``, wrapping around. The ring depends only on the *set* of target ids,
so listing workers in another order never moves a key, and removing one target moves only that target's keys.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable


def stable_hash64(s: str | bytes) -> int:
    """A 64-bit hash that is the same in every process (unlike ``hash()``, which is salted per process)."""
    data = s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Immutable ring; build a new one when the target set changes."""

    __slots__ = ("_owners", "_points", "target_ids")

    def __init__(self, target_ids: Iterable[str], virtual_nodes: int) -> None:
        if virtual_nodes <= 0:
            raise ValueError("virtual_nodes must be > 0")
        self.target_ids: frozenset[str] = frozenset(target_ids)
        if not self.target_ids:
            raise ValueError("a hash ring needs at least one target")
        # Sorting (point, id) pairs resolves a (vanishingly rare) point collision the same way everywhere.
        points = sorted(
            (stable_hash64(f"{tid}:{v}"), tid) for tid in self.target_ids for v in range(virtual_nodes)
        )
        self._points = [p for p, _ in points]
        self._owners = [tid for _, tid in points]

    def lookup(self, key: str) -> str:
        """The target id owning ``key``."""
        i = bisect.bisect_left(self._points, stable_hash64(key))
        return self._owners[i if i < len(self._owners) else 0]

    def __len__(self) -> int:
        return len(self.target_ids)
