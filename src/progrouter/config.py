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

REFERENCE_PREFILL_TOKENS = 50_000
REFERENCE_DECODE_BATCH_SIZE = 4
REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST = 50_000
CALIBRATION_DOCS = "docs/calibration.md"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending field."""


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

    intercept_seconds: float = 0.06600061907132926
    linear_seconds_per_1k_tokens: float = 0.05702024012166613
    quadratic_seconds_per_1k_tokens_squared: float = 0.0044057347937978475
    decode_throughput_alpha: float = 0.15

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

    fixed_step_seconds: float = 0.010635218423115973
    batch_step_seconds_per_request: float = 0.0004192803698834784
    context_step_seconds_per_token: float = 1.420458414996201e-7

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
    )
    binding_only: bool = False
    global_queue: bool = False
    resume_order: ResumeOrder = ResumeOrder.MRU
    cross_rank_headroom_ratio: float = 1.2
    binding_strategy: BindingStrategy = BindingStrategy.CONSISTENT_HASH
    hash_virtual_nodes: int = 160
    token_capacity_per_dp_rank: int | None = Field(
        default=None,
        validation_alias=AliasChoices("token_capacity_per_dp_rank", "token_capacity_per_target"),
    )
    max_active_programs_per_target: int = 64
    metrics_interval_seconds: float = 1.0
    admission_waiting_request_threshold: int = Field(default=1, ge=0)
    queue_timeout_seconds: float = 600.0
    force_resume_timeout_seconds: float = 300.0
    paused_retention_ttl_seconds: float = 1800.0
    shared_prefix_freshness_warmup_seconds: float = 100.0
    shared_prefix_freshness_kv_turnovers: float = 2.0
    decode_buffer_tokens: int = Field(default=100, ge=0)
    max_acting_ttl_seconds: float = 10.0
    # Caps a request's kv_retention_ttl_seconds hint: an Acting Program keeps its tokens charged for the TTL,
    # so an unbounded hint (1e308) would pin capacity until the force-resume timeout frees the waiters.
    max_kv_retention_ttl_seconds: float = 60.0
    # Requests waiting in the RequestPool, all Programs together; one more gets 429 + Retry-After. Each holds
    # its body (agent requests: ~0.1-1 MB), so 1,024 keeps a burst to about a gigabyte at worst.
    max_pooled_requests: int = 1024
    # Idle Paused Programs kept for resumption (each ~2 KB with its history); past it the one paused longest
    # ago is released first. Also how many released Programs' generation numbers are remembered.
    max_paused_programs: int = 10_000
    # Model pools (one per `model` value with Program traffic); a client can name any model, so past this
    # many a new name shares `program:all`. A fleet serves a few models and their LoRA adapters.
    max_model_pools: int = 64
    high_watermark_ratio: float = 1.0
    low_watermark_ratio: float = 1.0
    max_segment_rounds: int = 14
    stats_window_size: int = 100
    enable_batch_gain_admission: bool = True
    prefill_cost_model: PrefillCostModel = Field(default_factory=PrefillCostModel)
    decode_throughput_model: DecodeThroughputModel = Field(default_factory=DecodeThroughputModel)
    # Beyond the spec (docs/scheduler.md, "Improvements beyond the spec"); defaults keep the spec behaviour.
    acting_ttl_policy: ActingTTLPolicy = ActingTTLPolicy.SPEC
    weighed_ttl_max_seconds: float = 120.0  # the longest hold of the weighed TTL (nobody waiting)
    weighed_ttl_check_seconds: float = 5.0  # how often a held Program's weighed TTL is decided again
    cross_rank_gate: CrossRankGate = CrossRankGate.SPEC
    # Program scheduling on exact residency (docs/kv_events.md): the router subscribes to each worker's vLLM
    # KV events (worker URL -> the endpoint of its --kv-events-config, Rank r on port + r; a replay endpoint
    # per worker optional) and lets what each Rank really holds end an evicted Program's acting TTL, keep a
    # resident Program on its Rank, and bind to the Rank holding a prompt's prefix. Off until measured. With
    # --policy kv_aware it reads the policy's index and sources instead (leave kv_event_sources empty).
    residency_aware: bool = False
    kv_event_sources: dict[str, str] = Field(default_factory=dict)
    kv_event_replay_sources: dict[str, str] = Field(default_factory=dict)
    kv_event_block_size: int = Field(default=16, ge=1)
    # Beyond the spec (docs/scheduler.md): a Rank whose statistics windows are incomplete fits its acting
    # TTL to every Rank's samples together, and may take part in cross-Rank moves once those fill one window.
    stats_warmup: StatsWarmup = StatsWarmup.SPEC

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
        "token_capacity_per_dp_rank",
    )
    @classmethod
    def _count(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(
                f"{info.field_name}: Program scheduling counts and configured token capacity must be > 0"
            )
        return v

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
    worker_urls: list[str] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=0, le=65535)
    intra_node_data_parallel_size: int = Field(default=1, ge=1)
    api_key: str | None = None
    model_name: str | None = None
    worker_startup_timeout_secs: float = Field(default=600.0, gt=0)
    worker_startup_check_interval: float = Field(default=30.0, gt=0)
    max_payload_size: int = Field(default=512 * 1024 * 1024, gt=0)
    request_timeout_secs: float = Field(default=1800.0, gt=0)

    # Native request-level policy
    policy: Policy = Policy.CACHE_AWARE
    cache_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1.0)
    eviction_interval_secs: float = Field(default=120.0, gt=0)
    max_tree_size: int = Field(default=2**25, gt=0)

    # kv_aware: route on the Ranks' vLLM KV events (docs/kv_events.md)
    router_temperature: float = Field(default=0.0, ge=0.0)
    kv_penalty_host: float = Field(default=0.8, ge=0.0, le=1.0)
    kv_penalty_external: float = Field(default=0.6, ge=0.0, le=1.0)
    kv_penalty_disk: float = Field(default=0.3, ge=0.0, le=1.0)
    kv_aware_session_affinity_ttl_secs: int | None = Field(default=None, ge=1, le=31_536_000)
    kv_event_source: list[str] = Field(default_factory=list)
    kv_event_replay_source: list[str] = Field(default_factory=list)
    kv_event_block_size: int = Field(default=16, gt=0)
    kv_event_model: str | None = None
    # progrouter's own: the model's tokenizer files, so kv_aware can match text and chat prompts by token
    tokenizer: str | None = None

    # Retries: ``retry_max_retries`` counts attempts in all, as upstream (1 = no retry)
    retry_max_retries: int = Field(default=5, ge=0)
    retry_initial_backoff_ms: int = Field(default=50, ge=0)
    retry_max_backoff_ms: int = Field(default=30_000, ge=0)
    retry_backoff_multiplier: float = Field(default=1.5, ge=1.0)
    retry_jitter_factor: float = Field(default=0.2, ge=0.0, le=1.0)
    disable_retries: bool = False

    # Circuit breaker per worker
    cb_failure_threshold: int = Field(default=10, ge=1)
    cb_success_threshold: int = Field(default=3, ge=1)
    cb_timeout_duration_secs: float = Field(default=60.0, gt=0)
    cb_window_duration_secs: float = Field(default=120.0, gt=0)
    disable_circuit_breaker: bool = False

    # Health checks
    health_check_interval_secs: float = Field(default=60.0, gt=0)
    health_check_timeout_secs: float = Field(default=5.0, gt=0)
    health_check_endpoint: str = "/health"
    health_failure_threshold: int = Field(default=3, ge=1)
    health_success_threshold: int = Field(default=2, ge=1)

    # Inbound limits
    max_concurrent_requests: int = Field(default=32768, ge=1)
    queue_size: int = Field(default=100, ge=0)
    queue_timeout_secs: float = Field(default=60.0, gt=0)
    rate_limit_tokens_per_second: int | None = Field(default=None, ge=1)

    # Requests, CORS, shutdown
    request_id_headers: list[str] | None = None
    cors_allowed_origins: list[str] = Field(default_factory=list)
    drain_timeout_secs: float = Field(default=30.0, ge=0)

    # Observability
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int | None = Field(default=29000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_dir: str | None = None
    log_format: Literal["text", "json"] = "text"
    # Where GET /dashboard is served: the router's listener, the Prometheus listener, or nowhere.
    dashboard: Literal["router", "prometheus", "off"] = "router"
    otlp_traces_endpoint: str | None = None  # e.g. http://collector:4318/v1/traces

    program_scheduling: ProgramSchedulingConfig | None = None

    # The client edge (progrouter's own; see docs/router.md "Security"): who may call, and how long a client
    # may take to send a request. No keys configured means an open router, as upstream.
    client_api_keys: list[str] = Field(default_factory=list)
    client_api_keys_file: str | None = None
    admin_api_key: str | None = None
    client_header_timeout_secs: float = Field(default=30.0, gt=0)
    client_body_timeout_secs: float = Field(default=300.0, gt=0)
    client_keepalive_timeout_secs: float = Field(default=75.0, gt=0)
    max_client_connections: int = Field(default=8192, ge=1)
    # The hot proxied routes served below aiohttp's web layer (docs/performance.md "Front door").
    front_door: bool = True

    # `progrouter epp` only (beyond the spec; docs/epp.md): what of a response Envoy shows the endpoint
    # picker. ``stream``: every body chunk (the usage the worker reports, as serve reads it); ``end``: the
    # response headers and its end only (no usage: the scheduler keeps its own estimates).
    epp_response_body: Literal["stream", "end"] = "stream"
    # `progrouter epp` only (beyond the spec), with ``end``: each response's usage estimated from its
    # worker's vLLM counters (a Rank's tokens per request byte, cached share, completion tokens per request).
    epp_counter_usage: bool = False
    # `progrouter epp` only (beyond the spec): further pickers of the same pool, ``host:port`` each, that the
    # printed Envoy bootstrap fails over to (lower priority, health-checked) when this one is down.
    epp_standby: list[str] = Field(default_factory=list)

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
