"""What an arm is in the simulator: a native policy or a Program config, on bounded or unbounded KV.

The standard arms keep the live bench's meaning (``workload.bench.ARMS``): ``native`` is consistent hashing
of the session header, ``round_robin`` request-level round robin, ``program`` Program scheduling with the
given config, ``binding_only`` the same config with ``binding_only: true``, ``oracle`` native on Ranks whose
KV never runs out. Named variants add more Program arms (another config, or a retention hint) to the
same report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from progrouter.config import Policy, ProgramSchedulingConfig, parse_config
from progrouter.sim.requests import SimRequest
from progrouter.workload.arms import ARMS

#: A retention hint: None (send none), seconds, or ``"next-gap"``: an agent that knows how long its tool call
#: takes, i.e. the gap before the Program's next request plus ``NEXT_GAP_SLACK`` (a TTL of exactly the gap
#: expires at the very instant the request arrives, as timers due at ``now`` run first); 0 after its last.
#: ``"next-gap:MAX"`` asks for that only when the gap is at most MAX seconds, else 0 (retain short tool
#: calls only). ``"short:MAX"`` is an agent that knows only whether its tool call is short: MAX (+ the
#: slack) when the gap is at most MAX seconds, else 0.
Hint = float | str | None
NEXT_GAP = "next-gap"
SHORT = "short"
NEXT_GAP_SLACK = 0.1


@dataclass(frozen=True, slots=True)
class SimArm:
    name: str
    policy: Policy | None = Policy.CONSISTENT_HASH  # None: Program scheduling
    program: ProgramSchedulingConfig | None = None
    unbounded_kv: bool = False
    hint: Hint = None

    def describe(self) -> dict[str, Any]:
        """The arm in short: its policy or the Program config fields that differ from the defaults."""
        out: dict[str, Any] = {}
        if self.program is None:
            out["policy"] = None if self.policy is None else self.policy.value
        else:
            out["program_config"] = self.program.model_dump(mode="json", exclude_defaults=True)
        if self.unbounded_kv:
            out["unbounded_kv"] = True
        if self.hint is not None:
            out["kv_retention_hint"] = self.hint
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": None if self.policy is None else self.policy.value,
            "program_config": None if self.program is None else self.program.to_json_dict(),
            "unbounded_kv": self.unbounded_kv,
            "kv_retention_hint": self.hint,
        }


def program_config(data: dict[str, Any], *, where: str = "program config") -> ProgramSchedulingConfig:
    return parse_config(ProgramSchedulingConfig, data, prefix=where)


def standard_arm(name: str, config: dict[str, Any], hint: Hint = None) -> SimArm:
    """One of the bench's arms (``upstream`` needs a live process and is not simulated)."""
    spec = ARMS.get(name)
    if spec is None or spec.upstream or spec.residency:  # both need live processes (KV events, the wheel)
        known = ", ".join(n for n, a in ARMS.items() if not (a.upstream or a.residency))
        raise ValueError(f"unknown arm {name!r} (the simulator knows {known}, plus --variant names)")
    if not spec.program:
        return SimArm(name, Policy(spec.policy), unbounded_kv=spec.unbounded_kv)
    data = dict(config)
    if spec.binding_only:
        data["binding_only"] = True
    return SimArm(name, None, program_config(data, where=f"{name} config"), hint=hint)


def variant_arm(name: str, base: dict[str, Any], overrides: dict[str, Any], hint: Hint = None) -> SimArm:
    """A Program arm: ``base`` config with ``overrides`` on top."""
    return SimArm(name, None, program_config({**base, **overrides}, where=f"{name} config"), hint=hint)


def _seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0.0 <= seconds < float("inf") else None


def parse_hint(text: str | None) -> Hint:
    if text is None or text == "none":
        return None
    kind, colon, limit = text.partition(":")
    if text == NEXT_GAP or (kind in (NEXT_GAP, SHORT) and colon and _seconds(limit) is not None):
        return text
    seconds = _seconds(text)
    if seconds is None:
        raise ValueError(f"a retention hint is SECONDS, {NEXT_GAP}[:MAX], {SHORT}:MAX or none, not {text!r}")
    return seconds


def hint_value(hint: Hint, request: SimRequest) -> float | None:
    """The ``kv_retention_ttl_seconds`` this request carries under ``hint``."""
    if hint is None or isinstance(hint, float):
        return hint
    following = request.step + 1
    requests = request.program.requests
    if following >= len(requests):
        return 0.0
    gap = requests[following].gap
    kind, _, limit = hint.partition(":")
    if limit and gap > float(limit):
        return 0.0
    return (float(limit) if kind == SHORT else gap) + NEXT_GAP_SLACK
