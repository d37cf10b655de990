"""`progrouter engine`: serve the vLLM-compatible engine emulator.

The flags mirror vLLM's where vLLM has one (``--data-parallel-size``, ``--block-size``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--max-model-len``, ``--seed``; ``--num-blocks`` plays
``--num-gpu-blocks-override``). The seven cost coefficients take the names of their fields in the router's
``prefill_cost_model`` / ``decode_throughput_model`` config, so a calibration result maps onto them 1:1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from progrouter.config import CALIBRATION_FIELDS, DecodeThroughputModel, PrefillCostModel
from progrouter.engine.config import EngineConfig
from progrouter.engine.kv_events import KVEventsConfig, parse_kv_events_config
from progrouter.engine.profiles import BUILTIN, ProfileError, load_profile

_DEFAULTS = EngineConfig()
_COST_GROUPS = ("prefill_cost_model", "decode_throughput_model")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kv_events_config(text: str) -> KVEventsConfig:
    try:
        return parse_kv_events_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    parser.add_argument("--model-name", default=d.model_name, help="the served model name")
    parser.add_argument("--data-parallel-size", type=int, default=d.data_parallel_size, help="Ranks")
    parser.add_argument(
        "--engine-profile",
        default=None,
        metavar="NAME|FILE",
        help=f"cost models and KV size: {', '.join(BUILTIN)} or a calibration.json (flags override it)",
    )
    parser.add_argument(
        "--num-blocks", type=int, default=None, help=f"KV blocks per Rank (default {d.num_blocks})"
    )
    parser.add_argument(
        "--block-size", type=int, default=None, help=f"tokens per KV block (default {d.block_size})"
    )
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default: 32768 or one Rank's KV, whichever is smaller",
    )
    parser.add_argument(
        "--time-scale", type=float, default=d.time_scale, help="modelled seconds per wall second"
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--fail-rate", type=float, default=d.fail_rate, help="probability a request gets a 500"
    )
    parser.add_argument("--slow-factor", type=float, default=d.slow_factor, help="multiplies every step time")
    parser.add_argument(
        "--eos-probability",
        type=float,
        default=d.eos_probability,
        help="per-token EOS chance after min_tokens when ignore_eos is false (0: always max_tokens)",
    )
    parser.add_argument("--vocab-size", type=int, default=d.vocab_size)
    costs = parser.add_argument_group("cost model (defaults: the router's reference calibration)")
    for group, name in CALIBRATION_FIELDS:
        default = getattr(getattr(d, group), name)
        costs.add_argument(_flag(name), type=float, default=None, help=f"{group}.{name} (default {default})")
    parser.add_argument(
        "--kv-events-config",
        type=_kv_events_config,
        default=None,
        metavar="JSON",
        help='vLLM\'s KV events, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5567"}\' (Rank r: port + r)',
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_namespace(args: argparse.Namespace) -> EngineConfig:
    """An EngineConfig from parsed flags; flags a caller's namespace lacks keep their defaults."""
    profile = getattr(args, "engine_profile", None)
    fields: dict[str, Any] = (
        load_profile(profile).engine_fields(getattr(args, "block_size", None)) if profile else {}
    )
    for name in EngineConfig.model_fields:
        value = getattr(args, name, None)
        if value is not None and name not in _COST_GROUPS:
            fields[name] = value
    groups: dict[str, dict[str, float]] = {g: dict(fields.get(g, {})) for g in _COST_GROUPS}
    for group, name in CALIBRATION_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            groups[group][name] = value
    fields["prefill_cost_model"] = PrefillCostModel(**groups["prefill_cost_model"])
    fields["decode_throughput_model"] = DecodeThroughputModel(**groups["decode_throughput_model"])
    return EngineConfig.model_validate(fields)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from progrouter.engine.server import RunningEngine, serve_forever

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_namespace(args)
    except (ValidationError, ProfileError) as exc:
        print(f"progrouter engine: invalid configuration: {exc}", file=sys.stderr)
        return 2

    async def announce(engine: RunningEngine) -> None:
        cfg = engine.config
        print(
            f"progrouter engine: serving {cfg.model_name!r} on {engine.url} "
            f"({cfg.data_parallel_size} Rank(s) x {cfg.num_blocks} blocks of {cfg.block_size}, "
            f"time scale {cfg.time_scale})",
            flush=True,
        )

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        with contextlib.suppress(asyncio.CancelledError):
            await serve_forever(config, announce)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return 0
