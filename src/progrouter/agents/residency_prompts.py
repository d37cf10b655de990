"""The residency reports' raw material: each remembered Program's last prompt, as sampled block keys, and how
many of its leading tokens a Rank holds. One piece serves the router's KV-event index and the simulator's
block pools (``match`` says how many leading keys a Rank holds, None when its KV is unknown).

Memory and CPU stay small whatever the context length: a Program keeps at most ``SAMPLED_BLOCKS`` keys of its
prompt (its blocks at evenly spaced positions, the last one included; all of them for a prompt of up to that
many blocks), and remembered Programs are at most ``max_programs``, least recently seen forgotten first. A
Rank holds a prompt up to the last sampled block of the leading run it holds (vLLM evicts a chain tail first,
so what a Rank holds of it is a prefix); between samples this rounds down, by at most 1/64 of the prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from progrouter.program import ResidencyReport as Report

ProgramKey = tuple[str, str]  # (model pool, Program id)
#: How many leading keys of ``keys`` a Rank (target id) holds; None when its KV is unknown.
Match = Callable[[str, Sequence[int]], int | None]
SAMPLED_BLOCKS = 64


class PromptSample(NamedTuple):
    """Keys of a prompt's blocks at ``positions`` (block indexes, ascending, the last block last)."""

    positions: tuple[int, ...]
    keys: tuple[int, ...]

    @classmethod
    def of(cls, keys: Sequence[int]) -> PromptSample:
        n = len(keys)
        if n <= SAMPLED_BLOCKS:
            return cls(tuple(range(n)), tuple(keys))
        positions = sorted({(i + 1) * n // SAMPLED_BLOCKS - 1 for i in range(SAMPLED_BLOCKS)})
        return cls(tuple(positions), tuple(keys[i] for i in positions))

    @property
    def blocks(self) -> int:
        return self.positions[-1] + 1 if self.positions else 0


class ProgramPrompts:
    """The last prompt of each remembered Program, and the reports the scheduler hears of them."""

    __slots__ = ("_max_programs", "_prompts", "block_size")

    def __init__(self, block_size: int, max_programs: int) -> None:
        self.block_size = block_size
        self._max_programs = max_programs
        self._prompts: OrderedDict[ProgramKey, PromptSample] = OrderedDict()

    def __len__(self) -> int:
        return len(self._prompts)

    def arrival(
        self, key: ProgramKey, block_keys: Sequence[int], match: Match, target_ids: Iterable[str]
    ) -> Report:
        """Remember the prompt's keys for the Program; its report now (full-block tokens, held per Rank)."""
        sample = PromptSample.of(block_keys)
        self._prompts[key] = sample
        self._prompts.move_to_end(key)
        while len(self._prompts) > self._max_programs:
            self._prompts.popitem(last=False)
        return sample.blocks * self.block_size, self._resident(sample, match, target_ids)

    def report(self, match: Match, target_ids: Sequence[str]) -> dict[ProgramKey, Report]:
        """Every remembered Program's full-block tokens and resident tokens per known Rank."""
        size = self.block_size
        return {
            key: (s.blocks * size, self._resident(s, match, target_ids)) for key, s in self._prompts.items()
        }

    def _resident(self, sample: PromptSample, match: Match, target_ids: Iterable[str]) -> dict[str, int]:
        out = {}
        for target_id in target_ids:
            held = match(target_id, sample.keys)
            if held is not None:
                out[target_id] = (sample.positions[held - 1] + 1 if held else 0) * self.block_size
        return out
