"""Router and Program-scheduling configuration (pydantic v2).

Every field, default and constraint of ``spec/program_scheduling.md`` lives here, with the validation rules of
``spec/upstream-behavior.md`` §7. Unlike upstream, unknown keys are an error that names them: a misspelt knob
that is silently ignored is a scheduling bug nobody can see.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

REFERENCE_PREFILL_TOKENS = 50_000
REFERENCE_DECODE_BATCH_SIZE = 4
REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST = 50_000
CALIBRATION_DOCS = "docs/guides/calibrate.md"
#: ``token_capacity_per_dp_rank``'s value beyond the spec: each Rank's KV size as its vLLM reports it.
AUTO_TOKEN_CAPACITY = "auto"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending field."""


def setting(
    *,
    flag: str | None = None,
    action: Literal["append", "store_false"] | None = None,
    metavar: str | None = None,
    text_flag: bool = False,
    no_flag: bool = False,
    beyond: Literal["spec", "upstream"] | None = None,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
    group: str | None = None,
) -> JsonDict:
    """What a field declares beyond its type, default and description (``json_schema_extra``).

    The command line (``progrouter.config_cli``) and the settings reference (``progrouter.settings_doc``)
    are generated from the fields, so a setting is declared once: ``flag`` where it is not
    ``--<field-name>``, ``action`` for a repeatable or negative flag, ``text_flag`` when the model, not
    argparse, converts the text (``--prometheus-port off``), ``no_flag`` for settings of the file and
    environment only, ``beyond`` what the spec or upstream has, bounds that a validator (not a ``Field``
    constraint) enforces, as JSON-schema keywords, and the ``group`` (of ``--help`` and the reference)
    that this field opens; the fields after it belong to it until the next one opens another.
    """
    extra: JsonDict = {}
    for key, value in (
        ("x-flag", flag),
        ("x-flag-action", action),
        ("x-metavar", metavar),
        ("x-beyond", beyond),
        ("minimum", minimum),
        ("exclusiveMinimum", exclusive_minimum),
        ("maximum", maximum),
        ("x-group", group),
    ):
        if value is not None:
            extra[key] = value
    if text_flag:
        extra["x-flag-text"] = True
    if no_flag:
        extra["x-no-flag"] = True
    return extra


class EnableKey(StrEnum):
    CANONICAL = "vllm_xargs.agentic_context"
    AUTO = "auto"


class ResumeOrder(StrEnum):
    MRU = "mru"
    FCFS = "fcfs"


class ActingTTLPolicy(StrEnum):
    SPEC = "spec"  # the spec's fitted TTL, capped at max_acting_ttl_seconds
    WEIGHED = "weighed"  # idle seconds weighed by the work waiting for the KV, decided again while held
    FIXED = "fixed"  # every idle Active Program holds for max_acting_ttl_seconds, fit or no fit
    ADAPTIVE = "adaptive"  # weighed, each held second priced by the Rank share it keeps from the waiters


class CrossRankGate(StrEnum):
    SPEC = "spec"  # waited one metrics interval (and the spec's capacity gates)
    RECOMPUTE_COST = "recompute_cost"  # also: the source's KV is probably gone, or the wait exceeds the miss


class StatsWarmup(StrEnum):
    SPEC = "spec"  # a Rank's TTL and cross-Rank moves wait for its own windows to be complete
    POOL = "pool"  # until then, every Rank's samples together stand in once they fill one window


class BindingStrategy(StrEnum):
    CONSISTENT_HASH = "consistent_hash"
    PROGRAM_ROUND_ROBIN = "program_round_robin"
    LEAST_PROGRAM_COUNT = "least_program_count"
    REASONING_TOKEN_BALANCE = "reasoning_token_balance"
    CACHE_AWARE = "cache_aware"


class Policy(StrEnum):
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CONSISTENT_HASH = "consistent_hash"
    POWER_OF_TWO = "power_of_two"
    CACHE_AWARE = "cache_aware"
    STICKY_LEAST_LOADED = "sticky_least_loaded"
    KV_AWARE = "kv_aware"


def _finite(name: str, value: float, *, positive: bool = False) -> float:
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name}: Must be finite and {'> 0' if positive else '>= 0'}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, use_enum_values=False)


class PrefillCostModel(_Strict):
    """Cold-prefill seconds = intercept + linear·x + quadratic·x², x = uncached tokens / 1000."""

    intercept_seconds: float = Field(
        default=0.06600061907132926,
        description="fixed part of the cold-prefill estimate used by TTL utility and batch-gain decisions",
        json_schema_extra=setting(minimum=0),
    )
    linear_seconds_per_1k_tokens: float = Field(
        default=0.05702024012166613,
        description="cold-prefill seconds per 1K uncached prompt tokens",
        json_schema_extra=setting(minimum=0),
    )
    quadratic_seconds_per_1k_tokens_squared: float = Field(
        default=0.0044057347937978475,
        description="cold-prefill seconds per squared 1K uncached tokens (long prompts)",
        json_schema_extra=setting(minimum=0),
    )
    decode_throughput_alpha: float = Field(
        default=0.15,
        description="share of decode throughput kept while a prefill is mixed into the batch; the "
        "cache-miss impact is prefill seconds x (2 - alpha)",
        json_schema_extra=setting(minimum=0, maximum=1.0),
    )

    @field_validator(
        "intercept_seconds", "linear_seconds_per_1k_tokens", "quadratic_seconds_per_1k_tokens_squared"
    )
    @classmethod
    def _non_negative(cls, v: float, info: Any) -> float:
        return _finite(f"prefill_cost_model.{info.field_name}", v)

    @field_validator("decode_throughput_alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if not math.isfinite(v) or not 0.0 <= v <= 1.0:
            raise ValueError(
                "prefill_cost_model.decode_throughput_alpha: Must be finite and between 0 and 1 inclusive"
            )
        return v

    def prefill_seconds(self, uncached_tokens: float) -> float:
        """Modelled cold-prefill time of ``uncached_tokens`` (0 for none)."""
        if uncached_tokens <= 0:
            return 0.0
        x = uncached_tokens / 1000.0
        return (
            self.intercept_seconds
            + self.linear_seconds_per_1k_tokens * x
            + self.quadratic_seconds_per_1k_tokens_squared * x * x
        )

    def cache_miss_impact_seconds(self, uncached_tokens: float) -> float:
        """Prefill time plus the decode interference of mixing it into the batch."""
        return self.prefill_seconds(uncached_tokens) * (2.0 - self.decode_throughput_alpha)


class DecodeThroughputModel(_Strict):
    """Decode step seconds = fixed + batch·B + context·C (C = sum of full contexts)."""

    fixed_step_seconds: float = Field(
        default=0.010635218423115973,
        description="batch-independent decode-step seconds of the throughput surface (admission batch gain)",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    batch_step_seconds_per_request: float = Field(
        default=0.0004192803698834784,
        description="decode-step seconds each request in the batch adds",
        json_schema_extra=setting(minimum=0),
    )
    context_step_seconds_per_token: float = Field(
        default=1.420458414996201e-7,
        description="decode-step seconds each token of the batch's full Program contexts adds",
        json_schema_extra=setting(minimum=0),
    )

    @field_validator("fixed_step_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        return _finite("decode_throughput_model.fixed_step_seconds", v, positive=True)

    @field_validator("batch_step_seconds_per_request", "context_step_seconds_per_token")
    @classmethod
    def _non_negative(cls, v: float, info: Any) -> float:
        return _finite(f"decode_throughput_model.{info.field_name}", v)

    def step_seconds(self, batch_size: float, context_tokens: float) -> float:
        return (
            self.fixed_step_seconds
            + self.batch_step_seconds_per_request * batch_size
            + self.context_step_seconds_per_token * context_tokens
        )

    def throughput(self, batch_size: float, context_tokens: float) -> float:
        """Aggregate decode tokens/s of a batch of ``batch_size`` with ``context_tokens`` in total."""
        if batch_size <= 0:
            return 0.0
        return batch_size / self.step_seconds(batch_size, context_tokens)


CALIBRATION_FIELDS: tuple[tuple[str, str], ...] = (
    ("prefill_cost_model", "intercept_seconds"),
    ("prefill_cost_model", "linear_seconds_per_1k_tokens"),
    ("prefill_cost_model", "quadratic_seconds_per_1k_tokens_squared"),
    ("prefill_cost_model", "decode_throughput_alpha"),
    ("decode_throughput_model", "fixed_step_seconds"),
    ("decode_throughput_model", "batch_step_seconds_per_request"),
    ("decode_throughput_model", "context_step_seconds_per_token"),
)


class ProgramSchedulingConfig(_Strict):
    """Every knob of Program scheduling; defaults are the spec's."""

    program_scheduling_enable_key: EnableKey = Field(
        default=EnableKey.CANONICAL,
        validation_alias=AliasChoices("program_scheduling_enable_key", "enable_key"),
        description="which identity inputs opt a request in: only the canonical vllm_xargs.agentic_context, "
        "or auto (also the agent_hint and framework header schemas)",
    )
    binding_only: bool = Field(
        default=False,
        description="keep Program identity and the Program-to-Rank binding, but bypass RequestPool "
        "admission, Progress-TTL pause and resume scheduling (isolates the effect of Program affinity)",
    )
    global_queue: bool = Field(
        default=False,
        description="a paused Program may resume on another Rank that passes the cross-Rank capacity gates "
        "(its previous Rank is tried first); false: only on its bound Rank. Recommended: true",
    )
    resume_order: ResumeOrder = Field(
        default=ResumeOrder.MRU,
        description="order of Rank-local resume candidates within one force-resume, priority and "
        "segment-yield tier; cross-Rank resume is always FCFS",
    )
    cross_rank_headroom_ratio: float = Field(
        default=1.2,
        description="a cross-Rank destination needs the source Rank's free capacity plus this multiple of "
        "the Program's estimated context (no effect without global_queue)",
        json_schema_extra=setting(minimum=1.0),
    )
    binding_strategy: BindingStrategy = Field(
        default=BindingStrategy.CONSISTENT_HASH,
        description="how a new Program generation picks its home Rank (not admission or resume)",
    )
    hash_virtual_nodes: int = Field(
        default=160,
        description="virtual nodes of consistent_hash binding (no effect on the other strategies)",
        json_schema_extra=setting(minimum=1),
    )
    token_capacity_per_dp_rank: int | Literal["auto"] | None = Field(
        default=None,
        validation_alias=AliasChoices("token_capacity_per_dp_rank", "token_capacity_per_target"),
        description="logical KV-token capacity of each DP Rank: enables token-based admission, growth "
        "reserve, capacity repair and cross-Rank headroom checks; null: the Program-count guard only. "
        'reasoning_token_balance needs it. "auto" (beyond the spec): each Rank\'s KV size as its vLLM '
        "reports it in vllm:cache_config_info, followed when a worker rejoins or reports another size; "
        "a Rank whose size is not known yet has the Program-count guard only, and reasoning_token_balance "
        "counts it as having no token capacity",
        json_schema_extra=setting(minimum=1),
    )
    max_active_programs_per_target: int = Field(
        default=64,
        description="Active Programs on one Rank at most: the capacity guard without token capacity, a count "
        "guard with it; forced resume may override it",
        json_schema_extra=setting(minimum=1),
    )
    metrics_interval_seconds: float = Field(
        default=1.0,
        description="backend metrics polling and periodic scheduling interval; also observation freshness "
        "and the minimum residence of parts of cross-Rank resume",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    admission_waiting_request_threshold: int = Field(
        default=1,
        ge=0,
        description="ordinary admission or resume to a Rank stops while its vLLM waiting-request count "
        "reaches this (0: no waiting gate)",
    )
    queue_timeout_seconds: float = Field(
        default=600.0,
        description="longest a request may wait in the RequestPool (a request's deadline can shorten it)",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    force_resume_timeout_seconds: float = Field(
        default=300.0,
        description="fallback and upper bound of the workload-derived force-resume deadline that prevents "
        "starvation; at most queue_timeout_seconds",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    paused_retention_ttl_seconds: float = Field(
        default=1800.0,
        description="an idle Paused Program generation is released after this long",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    shared_prefix_freshness_warmup_seconds: float = Field(
        default=100.0,
        description="lifetime of a shared-prefix observation before the rolling statistics are mature, and "
        "when the dynamic estimate cannot be computed",
        json_schema_extra=setting(minimum=0),
    )
    shared_prefix_freshness_kv_turnovers: float = Field(
        default=2.0,
        description="the mature shared-prefix freshness interval, in estimated whole-KV-pool turnovers",
        json_schema_extra=setting(exclusive_minimum=0),
    )
    decode_buffer_tokens: int = Field(
        default=100,
        ge=0,
        description="output-growth allowance added to a Program's private-token demand when the request "
        "gives no expected_output_length",
    )
    max_acting_ttl_seconds: float = Field(
        default=10.0,
        description="cap of the acting TTL fitted from the interval window and the cache-miss impact (0 "
        "until the window is complete; a request's kv_retention_ttl_seconds replaces it)",
        json_schema_extra=setting(minimum=0),
    )
    # Caps a request's kv_retention_ttl_seconds hint: an Acting Program keeps its tokens charged for the TTL,
    # so an unbounded hint (1e308) would pin capacity until the force-resume timeout frees the waiters.
    max_kv_retention_ttl_seconds: float = Field(
        default=60.0,
        description="cap of a request's kv_retention_ttl_seconds hint (an Acting Program keeps its tokens "
        "charged for the TTL)",
        json_schema_extra=setting(beyond="spec", minimum=0),
    )
    # Requests waiting in the RequestPool, all Programs together; one more gets 429 + Retry-After. Each holds
    # its body (agent requests: ~0.1-1 MB), so 1,024 keeps a burst to about a gigabyte at worst.
    max_pooled_requests: int = Field(
        default=1024,
        description="requests waiting in the RequestPool, all Programs together; one more gets 429 with "
        "Retry-After",
        json_schema_extra=setting(beyond="spec", minimum=1),
    )
    # Idle Paused Programs kept for resumption (each ~2 KB with its history); past it the one paused longest
    # ago is released first. Also how many released Programs' generation numbers are remembered.
    max_paused_programs: int = Field(
        default=10_000,
        description="idle Paused Programs kept for resumption (the one paused longest ago is released "
        "first); also how many released Programs' generation numbers are remembered",
        json_schema_extra=setting(beyond="spec", minimum=1),
    )
    # Model pools (one per `model` value with Program traffic); a client can name any model, so past this
    # many a new name shares `program:all`. A fleet serves a few models and their LoRA adapters.
    max_model_pools: int = Field(
        default=64,
        description="model pools (one per model name with Program traffic); past it a new name shares "
        "program:all",
        json_schema_extra=setting(beyond="spec", minimum=1),
    )
    high_watermark_ratio: float = Field(
        default=1.0,
        description="share of token capacity past which capacity repair pauses reasoning Programs "
        "(>= low_watermark_ratio)",
        json_schema_extra=setting(exclusive_minimum=0, maximum=1.0),
    )
    low_watermark_ratio: float = Field(
        default=1.0,
        description="share of token capacity that admission and resume fill to, and capacity repair "
        "empties to; lower leaves more free KV",
        json_schema_extra=setting(exclusive_minimum=0, maximum=1.0),
    )
    max_segment_rounds: int = Field(
        default=14,
        description="cap of the protected continuous-service rounds; an idle Program past it yields under "
        "local queue pressure, with one-shot lower resume priority",
        json_schema_extra=setting(minimum=1),
    )
    stats_window_size: int = Field(
        default=100,
        description="samples needed before the growth and continuity estimates (and the automatic acting "
        "TTL) are active; also the rolling windows' size",
        json_schema_extra=setting(minimum=1),
    )
    enable_batch_gain_admission: bool = Field(
        default=True,
        description="modelled decode batch gain may bypass the continuous-growth reserve (never the "
        "capacity or Program-count limits)",
    )
    prefill_cost_model: PrefillCostModel = Field(
        default_factory=PrefillCostModel, description="cold-prefill cost model (calibrate it)"
    )
    decode_throughput_model: DecodeThroughputModel = Field(
        default_factory=DecodeThroughputModel, description="decode throughput surface (calibrate it)"
    )
    # Beyond the spec (docs/scheduler.md, "Improvements beyond the spec"); defaults keep the spec behaviour.
    acting_ttl_policy: ActingTTLPolicy = Field(
        default=ActingTTLPolicy.SPEC,
        description="spec: the fitted TTL capped at max_acting_ttl_seconds; weighed: idle seconds weighed "
        "by the work waiting for the KV, decided again while held; fixed: every idle Active Program holds "
        "for max_acting_ttl_seconds; adaptive: weighed, each held second priced by the share of the Rank it "
        "keeps from the waiters, no hold while a waiter's force-resume deadline is due",
        json_schema_extra=setting(beyond="spec"),
    )
    weighed_ttl_max_seconds: float = Field(
        default=120.0,
        description="the longest hold of the weighed and adaptive TTLs (nobody waiting)",
        json_schema_extra=setting(beyond="spec", exclusive_minimum=0),
    )
    weighed_ttl_check_seconds: float = Field(
        default=5.0,
        description="how often a held Program's weighed or adaptive TTL is decided again",
        json_schema_extra=setting(beyond="spec", exclusive_minimum=0),
    )
    cross_rank_gate: CrossRankGate = Field(
        default=CrossRankGate.SPEC,
        description="spec: a cross-Rank move waits one metrics interval (and the capacity gates); "
        "recompute_cost: also when the source's KV is probably gone or the wait exceeds the miss",
        json_schema_extra=setting(beyond="spec"),
    )
    # Program scheduling on exact residency (docs/kv_events.md): the router subscribes to each worker's vLLM
    # KV events (worker URL -> the endpoint of its --kv-events-config, Rank r on port + r; a replay endpoint
    # per worker optional) and lets what each Rank really holds end an evicted Program's acting TTL, keep a
    # resident Program on its Rank, and bind to the Rank holding a prompt's prefix. Off until measured. With
    # --policy kv_aware it reads the policy's index and sources instead (leave kv_event_sources empty).
    residency_aware: bool = Field(
        default=False,
        description="schedule on exact KV residency from the workers' vLLM KV events: an evicted Program's "
        "acting TTL ends, a resident Program stays, a prompt binds to the Rank holding its prefix (with "
        "--policy kv_aware: the policy's index and sources)",
        json_schema_extra=setting(beyond="spec"),
    )
    kv_event_sources: dict[str, str] = Field(
        default_factory=dict,
        description="worker URL -> the ZMQ endpoint of its --kv-events-config (Rank r on port + r)",
        json_schema_extra=setting(beyond="spec"),
    )
    kv_event_replay_sources: dict[str, str] = Field(
        default_factory=dict,
        description="worker URL -> its KV events replay endpoint (optional, per kv_event_sources entry)",
        json_schema_extra=setting(beyond="spec"),
    )
    kv_event_block_size: int = Field(
        default=16,
        ge=1,
        description="the workers' KV block size (tokens), for residency_aware",
        json_schema_extra=setting(beyond="spec"),
    )
    # Beyond the spec (docs/scheduler.md): a Rank whose statistics windows are incomplete fits its acting
    # TTL to every Rank's samples together, and may take part in cross-Rank moves once those fill one window.
    stats_warmup: StatsWarmup = Field(
        default=StatsWarmup.SPEC,
        description="spec: a Rank's TTL and cross-Rank moves wait for its own complete windows; pool: until "
        "then, every Rank's samples together stand in once they fill one window",
        json_schema_extra=setting(beyond="spec"),
    )
    # Beyond the spec (docs/identity.md): under `auto`, after the spec's sources, the session the harnesses
    # really send — Claude Code's metadata.user_id, OpenCode's x-opencode-session, Codex CLI's session_id.
    identity_extensions: bool = Field(
        default=False,
        description="under enable key auto, after every spec source is absent, also take the session the "
        "harnesses really send: Claude Code's metadata.user_id session, OpenCode's x-opencode-session, Codex "
        "CLI's session_id (with x-openai-subagent as the agent)",
        json_schema_extra=setting(beyond="spec"),
    )

    @field_validator(
        "weighed_ttl_max_seconds",
        "weighed_ttl_check_seconds",
        "metrics_interval_seconds",
        "queue_timeout_seconds",
        "force_resume_timeout_seconds",
        "paused_retention_ttl_seconds",
        "shared_prefix_freshness_kv_turnovers",
    )
    @classmethod
    def _positive(cls, v: float, info: Any) -> float:
        return _finite(str(info.field_name), v, positive=True)

    @field_validator(
        "max_acting_ttl_seconds", "max_kv_retention_ttl_seconds", "shared_prefix_freshness_warmup_seconds"
    )
    @classmethod
    def _non_negative(cls, v: float, info: Any) -> float:
        return _finite(str(info.field_name), v)

    @field_validator(
        "hash_virtual_nodes",
        "max_active_programs_per_target",
        "max_pooled_requests",
        "max_paused_programs",
        "max_model_pools",
        "stats_window_size",
        "max_segment_rounds",
    )
    @classmethod
    def _count(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(
                f"{info.field_name}: Program scheduling counts and configured token capacity must be > 0"
            )
        return v

    @field_validator("token_capacity_per_dp_rank", mode="before")
    @classmethod
    def _token_capacity(cls, v: object) -> object:
        """A positive integer, ``"auto"`` or null; anything else is refused with the three choices named."""
        if v is None or v == AUTO_TOKEN_CAPACITY:
            return v
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
        raise ValueError(
            f'{v!r} is not a positive integer, "auto" or null (the logical KV tokens of each DP Rank)'
        )

    @field_validator("cross_rank_headroom_ratio")
    @classmethod
    def _headroom(cls, v: float) -> float:
        if not math.isfinite(v) or v < 1.0:
            raise ValueError("cross_rank_headroom_ratio must be finite and >= 1")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> ProgramSchedulingConfig:
        low, high = self.low_watermark_ratio, self.high_watermark_ratio
        if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high <= 1.0):
            raise ValueError(
                "low_watermark_ratio/high_watermark_ratio: Program scheduling watermarks must satisfy "
                "0 < low <= high <= 1"
            )
        if self.force_resume_timeout_seconds > self.queue_timeout_seconds:
            raise ValueError("force_resume_timeout_seconds must not exceed queue_timeout_seconds")
        if (
            self.binding_strategy is BindingStrategy.REASONING_TOKEN_BALANCE
            and self.token_capacity_per_dp_rank is None
        ):
            raise ValueError("binding_strategy: reasoning_token_balance requires token_capacity_per_dp_rank")
        self._check_kv_event_sources()
        if self.identity_extensions and self.program_scheduling_enable_key is not EnableKey.AUTO:
            raise ValueError("identity_extensions requires program_scheduling_enable_key auto")
        return self

    def _check_kv_event_sources(self) -> None:
        extra = sorted(set(self.kv_event_replay_sources) - set(self.kv_event_sources))
        if extra:
            raise ValueError(f"kv_event_replay_sources: {extra[0]} has no kv_event_sources entry")
        for url, endpoint in (*self.kv_event_sources.items(), *self.kv_event_replay_sources.items()):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"kv_event_sources: {url!r} is not a worker URL (http:// or https://)")
            if not endpoint.startswith(("tcp://", "ipc://")):
                raise ValueError(f"kv_event_sources: {endpoint!r} must start with tcp:// or ipc://")

    def defaulted_calibration_fields(self) -> list[str]:
        """Dotted names of the seven coefficients that were not given explicitly."""
        out = []
        for group, name in CALIBRATION_FIELDS:
            explicit = name in getattr(self, group).model_fields_set and group in self.model_fields_set
            if not explicit:
                out.append(f"{group}.{name}")
        return out

    def reference_calibration_warning(self) -> dict[str, Any] | None:
        """The fields of the ``program_scheduling_reference_calibration`` warning, or None if not due."""
        if self.binding_only:
            return None
        defaulted = self.defaulted_calibration_fields()
        if not defaulted:
            return None
        context = REFERENCE_DECODE_BATCH_SIZE * REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST
        return {
            "event": "program_scheduling_reference_calibration",
            "defaulted_fields": defaulted,
            "reference_prefill_tokens": REFERENCE_PREFILL_TOKENS,
            "reference_prefill_seconds": self.prefill_cost_model.prefill_seconds(REFERENCE_PREFILL_TOKENS),
            "reference_decode_batch_size": REFERENCE_DECODE_BATCH_SIZE,
            "reference_decode_context_tokens_per_request": REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST,
            "reference_decode_context_tokens": context,
            "reference_decode_throughput_tokens_per_second": self.decode_throughput_model.throughput(
                REFERENCE_DECODE_BATCH_SIZE, context
            ),
            "calibration_docs": CALIBRATION_DOCS,
        }

    def to_json_dict(self) -> dict[str, Any]:
        """Serialized form: canonical key names only (the capacity alias is never emitted)."""
        return self.model_dump(mode="json", by_alias=False)

    @classmethod
    def resolve(cls, enabled: bool, raw_json: str | None) -> ProgramSchedulingConfig | None:
        """The CLI contract: the JSON is configuration only and needs the explicit enable flag."""
        if not enabled:
            if raw_json is not None:
                raise ConfigError(
                    "program_scheduling_config_json requires enable_program_scheduling "
                    "(pass --enable-program-scheduling)"
                )
            return None
        if raw_json is None:
            return cls()
        try:
            data = json.loads(raw_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"Invalid program_scheduling_config_json: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError("Invalid program_scheduling_config_json: expected a JSON object")
        return parse_config(cls, data, prefix="program_scheduling_config_json")


class RouterConfig(_Strict):
    """The whole router: what `progrouter serve` builds from its flags; library users build it directly.

    Field names, defaults and meanings are upstream vllm-router 0.1.17's (its ``RouterArgs``), so a
    command line or config file written for it means the same here.
    """

    # Workers and listening
    worker_urls: list[str] = Field(
        default_factory=list,
        description="vLLM server URLs; more can be added at runtime (POST /add_worker)",
        json_schema_extra=setting(group="Workers and listening"),
    )
    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=30000, ge=0, le=65535, description="port to listen on (0: any free port)")
    intra_node_data_parallel_size: int = Field(
        default=1,
        ge=1,
        description="DP Ranks per worker URL; Rank r is addressed with the header X-data-parallel-rank: r",
    )
    api_key: str | None = Field(default=None, description="sent to workers as Authorization: Bearer <key>")
    model_name: str | None = Field(
        default=None,
        description="upstream's RouterArgs field, accepted so its config files load; not used",
        json_schema_extra=setting(no_flag=True),
    )
    worker_startup_timeout_secs: float = Field(
        default=600.0,
        gt=0,
        description="how long serve (and POST /add_worker) waits for a worker to answer its health endpoint",
    )
    worker_startup_check_interval: float = Field(
        default=30.0, gt=0, description="seconds between those startup checks"
    )
    max_payload_size: int = Field(
        default=512 * 1024 * 1024, gt=0, description="largest request body in bytes"
    )
    request_timeout_secs: float = Field(default=1800.0, gt=0, description="bound on one request to a worker")

    # Native request-level policy
    policy: Policy = Field(
        default=Policy.CACHE_AWARE,
        description="native routing policy for requests without Program identity",
        json_schema_extra=setting(group="Routing policy"),
    )
    cache_threshold: float = Field(
        default=0.3, ge=0.0, le=1.0, description="cache_aware: minimum prefix match ratio (0.0-1.0)"
    )
    balance_abs_threshold: int = Field(
        default=64, ge=0, description="cache_aware balances load when (max - min) > abs AND max > min * rel"
    )
    balance_rel_threshold: float = Field(
        default=1.5, ge=1.0, description="cache_aware: see --balance-abs-threshold"
    )
    eviction_interval_secs: float = Field(
        default=120.0, gt=0, description="cache_aware: seconds between prefix-tree evictions"
    )
    max_tree_size: int = Field(
        default=2**25, gt=0, description="cache_aware: characters kept per worker, enforced at eviction"
    )

    # kv_aware: route on the Ranks' vLLM KV events (docs/kv_events.md)
    router_temperature: float = Field(
        default=0.0,
        ge=0.0,
        description="kv_aware: softmax temperature (0 selects minimum cost)",
        json_schema_extra=setting(group="kv_aware policy"),
    )
    kv_penalty_host: float = Field(
        default=0.8, ge=0.0, le=1.0, description="kv_aware: host-tier KV transfer credit (0.0-1.0)"
    )
    kv_penalty_external: float = Field(
        default=0.6, ge=0.0, le=1.0, description="kv_aware: external-tier KV transfer credit (0.0-1.0)"
    )
    kv_penalty_disk: float = Field(
        default=0.3, ge=0.0, le=1.0, description="kv_aware: disk-tier KV transfer credit (0.0-1.0)"
    )
    kv_aware_session_affinity_ttl_secs: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="kv_aware: session affinity idle TTL (1-31536000)",
    )
    kv_event_source: list[str] = Field(
        default_factory=list,
        description="kv_aware: static ZMQ KV event source, one endpoint per DP Rank; repeat per worker",
        json_schema_extra=setting(action="append", metavar="WORKER_URL=ENDPOINT[,ENDPOINT...]"),
    )
    kv_event_replay_source: list[str] = Field(
        default_factory=list,
        description="kv_aware: ZMQ replay endpoints matching a worker's event source",
        json_schema_extra=setting(action="append", metavar="WORKER_URL=ENDPOINT[,ENDPOINT...]"),
    )
    kv_event_block_size: int = Field(
        default=16, gt=0, description="kv_aware: KV block size of static event sources"
    )
    kv_event_model: str | None = Field(
        default=None, description="kv_aware: shared model identity of static event sources"
    )
    # progrouter's own: the model's tokenizer files, so kv_aware can match text and chat prompts by token
    tokenizer: str | None = Field(
        default=None,
        description="kv_aware (progrouter's own): the model's tokenizer files (a directory with "
        "tokenizer.json, tokenizer_config.json), so text and chat prompts are matched by token; unset: by "
        "characters",
        json_schema_extra=setting(beyond="upstream"),
    )

    # Retries: ``retry_max_retries`` counts attempts in all, as upstream (1 = no retry)
    retry_max_retries: int = Field(
        default=5,
        ge=0,
        description="attempts per request in all (1: no retry)",
        json_schema_extra=setting(group="Retries"),
    )
    retry_initial_backoff_ms: int = Field(default=50, ge=0, description="backoff before the first retry")
    retry_max_backoff_ms: int = Field(default=30_000, ge=0, description="largest backoff between retries")
    retry_backoff_multiplier: float = Field(default=1.5, ge=1.0, description="backoff growth per retry")
    retry_jitter_factor: float = Field(
        default=0.2, ge=0.0, le=1.0, description="random share of each backoff (0.0-1.0)"
    )
    disable_retries: bool = Field(default=False, description="no retries (same as --retry-max-retries 1)")

    # Circuit breaker per worker
    cb_failure_threshold: int = Field(
        default=10,
        ge=1,
        description="failures within the window that open a worker's circuit",
        json_schema_extra=setting(group="Circuit breaker"),
    )
    cb_success_threshold: int = Field(default=3, ge=1, description="half-open successes that close it again")
    cb_timeout_duration_secs: float = Field(
        default=60.0, gt=0, description="how long an open circuit stays open"
    )
    cb_window_duration_secs: float = Field(
        default=120.0, gt=0, description="window the failures are counted in"
    )
    disable_circuit_breaker: bool = Field(default=False, description="no circuit breaker")

    # Health checks
    health_check_interval_secs: float = Field(
        default=60.0,
        gt=0,
        description="seconds between health checks",
        json_schema_extra=setting(group="Health checks"),
    )
    health_check_timeout_secs: float = Field(default=5.0, gt=0, description="timeout of one health check")
    health_check_endpoint: str = Field(default="/health", description="worker path probed by health checks")
    health_failure_threshold: int = Field(
        default=3, ge=1, description="consecutive failed checks that mark a worker unhealthy"
    )
    health_success_threshold: int = Field(
        default=2, ge=1, description="consecutive passed checks that mark it healthy again"
    )

    # Inbound limits
    max_concurrent_requests: int = Field(
        default=32768,
        ge=1,
        description="requests served at once",
        json_schema_extra=setting(group="Inbound limits"),
    )
    queue_size: int = Field(
        default=100, ge=0, description="0: no queue, answer 429 at once; else requests wait for a slot"
    )
    queue_timeout_secs: float = Field(
        default=60.0, gt=0, description="longest wait for a slot, from the request's arrival (then 408)"
    )
    rate_limit_tokens_per_second: int | None = Field(
        default=None, ge=1, description="token bucket refill rate (unset: max-concurrent-requests)"
    )

    # Requests, CORS, shutdown
    request_id_headers: list[str] | None = Field(
        default=None,
        description="headers read for the request id, first present wins",
        json_schema_extra=setting(group="Requests, CORS, shutdown"),
    )
    cors_allowed_origins: list[str] = Field(default_factory=list, description="origins answered by CORS")
    drain_timeout_secs: float = Field(
        default=30.0,
        ge=0,
        description="progrouter's own: on SIGTERM, how long in-flight requests may take to finish",
        json_schema_extra=setting(beyond="upstream"),
    )

    # Observability
    prometheus_host: str = Field(
        default="127.0.0.1",
        description="address of the Prometheus /metrics listener",
        json_schema_extra=setting(group="Observability"),
    )
    prometheus_port: int | None = Field(
        default=29000,
        ge=0,
        le=65535,
        description="port of the Prometheus /metrics listener (0: any free port; 'off': no listener)",
        json_schema_extra=setting(text_flag=True),
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="info", description="log level"
    )
    log_dir: str | None = Field(
        default=None, description="also write a rotating log file (progrouter.log) in this directory"
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text, or json: one object per line",
        json_schema_extra=setting(beyond="upstream"),
    )
    # Where GET /dashboard is served: the router's listener, the Prometheus listener, or nowhere.
    dashboard: Literal["router", "prometheus", "off"] = Field(
        default="router",
        description="where GET /dashboard is served",
        json_schema_extra=setting(beyond="upstream"),
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry OTLP/HTTP traces URL (needs progrouter[otel])",
        json_schema_extra=setting(metavar="URL", beyond="upstream"),
    )  # e.g. http://collector:4318/v1/traces

    program_scheduling: ProgramSchedulingConfig | None = Field(
        default=None,
        description="Program scheduling settings (the keys below); null: off. On the command line: "
        "--enable-program-scheduling and --program-scheduling-config-json",
        json_schema_extra=setting(group="Program scheduling", no_flag=True),
    )

    # The client edge (progrouter's own; see docs/router.md "Security"): who may call, and how long a client
    # may take to send a request. No keys configured means an open router, as upstream.
    client_api_keys: list[str] = Field(
        default_factory=list,
        description="a bearer token clients must send (repeatable); none: an open router, as upstream",
        json_schema_extra=setting(
            group="Client edge", flag="--client-api-key", action="append", metavar="KEY", beyond="upstream"
        ),
    )
    client_api_keys_file: str | None = Field(
        default=None,
        description="client keys, one per line (# comments)",
        json_schema_extra=setting(metavar="PATH", beyond="upstream"),
    )
    admin_api_key: str | None = Field(
        default=None,
        description="the key for admin routes (unset: any client key)",
        json_schema_extra=setting(metavar="KEY", beyond="upstream"),
    )
    client_header_timeout_secs: float = Field(
        default=30.0,
        gt=0,
        description="408 when a client's request headers take longer",
        json_schema_extra=setting(beyond="upstream"),
    )
    client_body_timeout_secs: float = Field(
        default=300.0,
        gt=0,
        description="408 when a client's request body takes longer",
        json_schema_extra=setting(beyond="upstream"),
    )
    client_keepalive_timeout_secs: float = Field(
        default=75.0,
        gt=0,
        description="idle client connections are closed after it",
        json_schema_extra=setting(beyond="upstream"),
    )
    max_client_connections: int = Field(
        default=8192,
        ge=1,
        description="client connections at once; 503 past it",
        json_schema_extra=setting(beyond="upstream"),
    )
    # The hot proxied routes served below aiohttp's web layer (docs/performance.md "Front door").
    front_door: bool = Field(
        default=True,
        description="serve the hot proxied routes below aiohttp's web layer; off (--no-front-door): every "
        "route through aiohttp's web layer",
        json_schema_extra=setting(flag="--no-front-door", action="store_false", beyond="upstream"),
    )

    # `progrouter epp` only: what of a response Envoy shows the endpoint picker, and its standby pickers.
    epp_response_body: Literal["stream", "end"] = Field(
        default="stream",
        description="progrouter epp: what of a response Envoy shows the picker — every body chunk, for the "
        "usage the worker reports as serve reads it (stream), or its headers and its end only (end: fewer "
        "messages, no usage); the printed bootstrap follows it",
        json_schema_extra=setting(beyond="spec", group="Endpoint picker (progrouter epp)"),
    )
    epp_counter_usage: bool = Field(
        default=False,
        description="progrouter epp, with epp_response_body end: estimate each response's usage from its "
        "worker's vLLM counters (a Rank's tokens per request byte, cached share, completion tokens)",
        json_schema_extra=setting(beyond="spec"),
    )
    epp_standby: list[str] = Field(
        default_factory=list,
        description="progrouter epp: standby pickers of the same pool (host:port each) that the printed "
        "Envoy bootstrap fails over to, in order, while this one is down",
        json_schema_extra=setting(beyond="spec", metavar="HOST:PORT"),
    )

    @field_validator("client_api_keys", "admin_api_key")
    @classmethod
    def _keys_usable(cls, v: list[str] | str | None) -> list[str] | str | None:
        if not all(_usable_key(key) for key in ([v] if isinstance(v, str) else v or [])):
            raise ValueError("an API key must be non-empty printable text without whitespace")
        return v

    @field_validator("client_api_keys_file")
    @classmethod
    def _keys_file_readable(cls, v: str | None) -> str | None:
        if v is not None:
            read_keys_file(v)
        return v

    @field_validator("epp_standby")
    @classmethod
    def _host_ports(cls, v: list[str]) -> list[str]:
        for address in v:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"epp_standby: {address!r} is not host:port")
        return v

    @field_validator("worker_urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not (url.startswith("http://") or url.startswith("https://")):
                raise ValueError(f"worker_urls: {url!r} is not an http(s) URL")
        return [u.rstrip("/") for u in v]

    @field_validator("prometheus_port", mode="before")
    @classmethod
    def _port_or_off(cls, v: Any) -> Any:
        """``off`` (or none/null/disabled) runs no metrics listener; 0 picks any free port."""
        if isinstance(v, str) and v.strip().lower() in ("off", "none", "null", "disabled"):
            return None
        return v

    @model_validator(mode="after")
    def _counter_usage_needs_end(self) -> RouterConfig:
        if self.epp_counter_usage and self.epp_response_body != "end":
            raise ValueError("epp_counter_usage: only with epp_response_body end (stream reads the usage)")
        return self

    @model_validator(mode="after")
    def _kv_aware_settings(self) -> RouterConfig:
        """Upstream's rules for kv_aware and its event sources, so a command line means the same."""
        self._residency_sources()
        if self.policy is not Policy.KV_AWARE:
            if self.kv_event_source or self.kv_event_replay_source:
                raise ValueError("--kv-event-source requires the kv_aware policy")
            return self
        sources = parse_kv_sources(self.kv_event_source, "kv_event_source")
        replays = parse_kv_sources(self.kv_event_replay_source, "kv_event_replay_source")
        if sources and not self.kv_event_model:
            raise ValueError(
                "static KV event sources require worker URLs and model identity (--kv-event-model)"
            )
        for url, endpoints in sources.items():
            if url not in self.worker_urls:
                raise ValueError(f"static KV event source worker {url!r} is not in --worker-urls")
            if len(endpoints) != self.intra_node_data_parallel_size:
                raise ValueError(
                    f"kv_event_source {url!r}: one endpoint per DP Rank, in Rank order "
                    f"({self.intra_node_data_parallel_size} expected, {len(endpoints)} given)"
                )
        for url, endpoints in replays.items():
            if url not in sources:
                raise ValueError("--kv-event-replay-source requires a matching --kv-event-source")
            if len(endpoints) != len(sources[url]):
                raise ValueError(f"kv_event_replay_source {url!r}: one replay endpoint per event endpoint")
        return self

    def _residency_sources(self) -> None:
        """``residency_aware`` reads one index: its own ``kv_event_sources``, or with ``--policy kv_aware``
        the policy's (one subscriber per Rank, one block size), never both."""
        program = self.program_scheduling
        if program is None or not program.residency_aware:
            return
        if self.policy is not Policy.KV_AWARE:
            if not program.kv_event_sources:
                raise ValueError("residency_aware needs kv_event_sources (worker URL -> KV events endpoint)")
            return
        if program.kv_event_sources:
            raise ValueError(
                "with --policy kv_aware, residency_aware reads the policy's --kv-event-source: "
                "leave program_scheduling.kv_event_sources empty"
            )
        if "kv_event_block_size" in program.model_fields_set:
            raise ValueError(
                "with --policy kv_aware, residency_aware uses --kv-event-block-size: "
                "leave program_scheduling.kv_event_block_size unset"
            )

    @property
    def retry_attempts(self) -> int:
        """Attempts per request in all: upstream's ``retry_max_retries``, 1 with ``disable_retries``."""
        return 1 if self.disable_retries else max(1, self.retry_max_retries)

    @property
    def circuit_breaker_enabled(self) -> bool:
        return not self.disable_circuit_breaker


def parse_kv_sources(entries: list[str], name: str) -> dict[str, tuple[str, ...]]:
    """``WORKER_URL=ENDPOINT[,ENDPOINT...]`` entries as worker URL → endpoints (ordered by DP Rank)."""
    out: dict[str, tuple[str, ...]] = {}
    flag = name.replace("_", "-")
    for entry in entries:
        url, sep, rest = entry.partition("=")
        url = url.strip().rstrip("/")
        endpoints = tuple(e.strip() for e in rest.split(","))
        if not sep or not url or not all(endpoints):
            raise ValueError(f"--{flag} expects WORKER_URL=ENDPOINT[,ENDPOINT...], got {entry!r}")
        bad = next((e for e in endpoints if not e.startswith(("tcp://", "ipc://", "inproc://"))), None)
        if bad is not None:
            raise ValueError(f"{name}: {bad!r} is not a ZMQ endpoint (tcp://, ipc:// or inproc://)")
        if url in out:
            raise ValueError(f"duplicate --{flag} worker URL {url!r}")
        out[url] = endpoints
    return out


def read_keys_file(path: str) -> list[str]:
    """The API keys in ``path``: one per line; blank lines and ``#`` comments are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read API keys from {path!r}: {exc.__class__.__name__}") from exc
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"{path!r} holds no API key")
    if not all(_usable_key(key) for key in keys):
        raise ValueError(f"{path!r}: a key holds whitespace or a control character")
    return keys


def _usable_key(key: str) -> bool:
    """A bearer token can carry it: non-empty printable text without whitespace."""
    return bool(key) and not any(c.isspace() or not c.isprintable() for c in key)


M = TypeVar("M", bound=BaseModel)


def parse_config(cls: type[M], data: dict[str, Any], *, prefix: str) -> M:
    """Validate ``data`` as ``cls``; errors become one ConfigError naming every bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"Invalid {prefix}: {describe_validation_error(exc)}") from exc


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
