"""An approximate, per-target prefix tree of request text: where is a prompt's prefix likely cached?

Theory of operation. The router never asks a worker what it caches; it remembers which text it sent where.
One radix tree over characters is shared by all targets; every node records, per target, the logical time
it was last used on that target. A target "has" a node when it has the node's whole path, so matching a
text walks down once and yields, per target, how many leading characters it probably holds.

Memory is bounded per target. As upstream, the bound ``max_size_chars`` is enforced by ``evict()``, which the
router calls every ``eviction_interval_secs``: each target's least recently used leaves are dropped until it
holds at most the bound. Between passes a target may grow, but never past twice the bound: an insert that
goes beyond trims it back at once, so memory stays bounded even with a long interval. Nodes no target holds
are unlinked.

The decisions built on it:
- ``choose_by_load``: the native cache_aware policy (upstream/sglang): when load is imbalanced take the least
  loaded target; else when the best match covers more than ``cache_threshold`` of the text, take it; else the
  least loaded, the smallest tree breaking ties.
- ``choose_initial``: Program ``cache_aware`` binding: prefix affinity weighted by KV pressure.

Sans-I/O: no clock (a logical counter orders uses), no asyncio, no network.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

_HARD_CAP = 2  # × max_size_chars, enforced on insert between eviction passes


class _Node:
    __slots__ = ("children", "parent", "serial", "targets", "text")

    def __init__(self, text: str, parent: _Node | None, serial: int) -> None:
        self.text = text
        self.parent = parent
        self.serial = serial
        self.children: dict[str, _Node] = {}
        self.targets: dict[str, int] = {}  # target id -> logical time of last use


def _common_prefix_len(edge: str, text: str, start: int) -> int:
    """Length of the common prefix of ``edge`` and ``text[start:]``; C-speed comparisons, no char loop."""
    if text.startswith(edge, start):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - start)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(edge[:mid], start):
            lo = mid
        else:
            hi = mid - 1
    return lo


class CacheAwareIndex:
    """Prefix affinity per target id, with the cache_aware decisions that use it."""

    def __init__(
        self,
        max_size_chars: int,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        if max_size_chars <= 0:
            raise ValueError("max_size_chars must be > 0")
        self.max_size_chars = max_size_chars
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self._serials = itertools.count(1)
        self._root = _Node("", None, 0)
        self._clock = 0
        self._sizes: dict[str, int] = {}
        self._nodes: dict[str, set[_Node]] = {}

    # ----------------------------------------------------------------------------------------- the tree
    def size(self, target_id: str) -> int:
        """Characters currently attributed to ``target_id``."""
        return self._sizes.get(target_id, 0)

    def match(self, text: str) -> dict[str, int]:
        """Target id → number of leading characters of ``text`` it probably has cached (absent: none)."""
        out: dict[str, int] = {}
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            n = _common_prefix_len(child.text, text, i)
            for tid in child.targets:
                out[tid] = i + n
            if n < len(child.text):
                break
            node, i = child, i + n
        return out

    def insert(self, text: str, target_id: str) -> None:
        """Record that ``text`` was sent to ``target_id`` (which now likely caches it)."""
        self._clock += 1
        now = self._clock
        nodes = self._nodes.setdefault(target_id, set())
        self._sizes.setdefault(target_id, 0)
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = _Node(text[i:], node, next(self._serials))
                node.children[text[i]] = child
                n = len(child.text)
            else:
                n = _common_prefix_len(child.text, text, i)
                if n < len(child.text):
                    child = self._split(child, n)
            if target_id not in child.targets:
                self._sizes[target_id] += len(child.text)
                nodes.add(child)
            child.targets[target_id] = now
            node, i = child, i + n
        if self._sizes[target_id] > _HARD_CAP * self.max_size_chars:
            self._evict(target_id, self.max_size_chars)

    def evict(self) -> int:
        """The periodic pass: trim every target to ``max_size_chars``; the number of characters dropped."""
        before = sum(self._sizes.values())
        for target_id, size in list(self._sizes.items()):
            if size > self.max_size_chars:
                self._evict(target_id, self.max_size_chars)
        return before - sum(self._sizes.values())

    def remove_target(self, target_id: str) -> None:
        """Forget everything attributed to ``target_id`` (it left the fleet)."""
        for node in self._nodes.pop(target_id, ()):
            del node.targets[target_id]
            if not node.targets:
                self._unlink(node)
        self._sizes.pop(target_id, None)

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node``'s edge after ``n`` chars; the new upper node is held by the same targets."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.text[:n], parent, next(self._serials))
        upper.targets = dict(node.targets)
        node.text = node.text[n:]
        node.parent = upper
        upper.children[node.text[0]] = node
        parent.children[upper.text[0]] = upper
        for tid in upper.targets:
            self._nodes[tid].add(upper)
        return upper

    def _unlink(self, node: _Node) -> None:
        parent = node.parent
        if parent is not None and parent.children.get(node.text[0]) is node:
            del parent.children[node.text[0]]

    @staticmethod
    def _is_leaf_of(node: _Node, target_id: str) -> bool:
        return not any(target_id in c.targets for c in node.children.values())

    def _evict(self, target_id: str, limit: int) -> None:
        nodes = self._nodes[target_id]
        heap = [(n.targets[target_id], n.serial, n) for n in nodes if self._is_leaf_of(n, target_id)]
        heapq.heapify(heap)
        while self._sizes[target_id] > limit and heap:
            _, _, node = heapq.heappop(heap)
            del node.targets[target_id]
            nodes.discard(node)
            self._sizes[target_id] -= len(node.text)
            if not node.targets:
                self._unlink(node)
            parent = node.parent
            if parent is not None and parent is not self._root and self._is_leaf_of(parent, target_id):
                heapq.heappush(heap, (parent.targets[target_id], parent.serial, parent))

    # ------------------------------------------------------------------------------------ the decisions
    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        """Both thresholds exceeded: (max − min) > abs and max > rel × min."""
        if not loads:
            return False
        lo, hi = min(loads), max(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def choose_by_load(self, text: str, candidates: Sequence[tuple[str, int]]) -> tuple[str, str]:
        """Native cache_aware: (target id, decision) for candidates given as (target id, in-flight load).

        Decisions: ``load_balance`` (imbalanced), ``cache_affinity`` (match ratio > cache_threshold),
        ``low_match_min_load``. Does not insert; the caller records the text where it sent it.
        """
        if not candidates:
            raise ValueError("no candidates")

        def least_loaded() -> str:
            return min(candidates, key=lambda c: (c[1], self.size(c[0]), c[0]))[0]

        if self.is_imbalanced([load for _, load in candidates]):
            return least_loaded(), "load_balance"
        if text:
            allowed = {tid for tid, _ in candidates}
            matched = [(n, tid) for tid, n in self.match(text).items() if tid in allowed]
            if matched:
                best_chars = max(n for n, _ in matched)
                if best_chars / len(text) > self.cache_threshold:
                    loads = dict(candidates)
                    best = min((loads[tid], tid) for n, tid in matched if n == best_chars)[1]
                    return best, "cache_affinity"
        return least_loaded(), "low_match_min_load"

    def choose_initial(self, text: str, candidates: Sequence[tuple[str, float]]) -> str:
        """Program cache_aware binding: candidates are (target id, kv_pressure in 0..1).

        score = (1 − pressure) × (1 + match_ratio), where match_ratio counts only above cache_threshold:
        a full prefix match can at most double a Rank's appeal, so affinity wins while the matched Rank
        has more than half the headroom of the emptiest one, and never on a full Rank. Ties go to the
        lower pressure, then the smaller target id; a cold burst therefore spreads as pressure builds.
        """
        if not candidates:
            raise ValueError("no candidates")
        matched = self.match(text) if text else {}

        def rank(c: tuple[str, float]) -> tuple[float, float, str]:
            tid, pressure = c
            p = min(max(pressure, 0.0), 1.0)
            ratio = matched.get(tid, 0) / len(text) if text else 0.0
            affinity = ratio if ratio > self.cache_threshold else 0.0
            return (-(1.0 - p) * (1.0 + affinity), p, tid)

        return min(candidates, key=rank)[0]
