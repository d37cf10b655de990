"""Command-line parity with the wheel: every regular-mode long flag of ``vllm-router --help`` is in
``progrouter serve --help``, with the default the wheel shows; each PD-only flag stops startup with one
clear line saying PD mode is not supported (never argparse noise)."""

from __future__ import annotations

import asyncio
import re
import sys

from .routers import upstream_bin

# PD (prefill/decode disaggregation) only, with a value each takes (None: a switch).
PD_ONLY: dict[str, str | None] = {
    "--vllm-pd-disaggregation": None,
    "--mini-lb": None,
    "--prefill": "http://127.0.0.1:9",
    "--decode": "http://127.0.0.1:9",
    "--prefill-policy": "round_robin",
    "--decode-policy": "round_robin",
    "--pd-kv-events": "http://127.0.0.1:9=tcp://127.0.0.1:9",
    "--prefill-selector": "app=prefill",
    "--decode-selector": "app=decode",
    "--vllm-discovery-address": "127.0.0.1:9",
    "--kv-connector": "nixl",
}
OURS = [sys.executable, "-m", "progrouter", "serve"]
# One line such as "PD (prefill/decode disaggregated) mode is not supported".
PD_REFUSAL = re.compile(r"\bPD\b.*\bmode is not supported")


async def run(*argv: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{' '.join(argv)} still running after {timeout}s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def long_flags(help_text: str) -> set[str]:
    """The long options a ``--help`` page documents (its options section, one per line start)."""
    return set(re.findall(r"^\s{2}(--[a-z0-9][a-z0-9-]*)", help_text, re.MULTILINE)) - {"--help"}


async def test_every_regular_mode_flag_of_the_wheel_is_accepted() -> None:
    (_, upstream_help, _), (code, ours_help, _) = await asyncio.gather(
        run(str(upstream_bin()), "--help"), run(*OURS, "--help")
    )
    upstream = long_flags(upstream_help)
    assert len(upstream) == 71 and set(PD_ONLY) <= upstream  # the 0.1.17 page, parsed
    assert code == 0
    missing = sorted(upstream - set(PD_ONLY) - long_flags(ours_help))
    assert missing == []


def shown_defaults(help_text: str) -> dict[str, str]:
    """Each long option's ``(default: X)`` as its help entry shows it (options without one left out)."""
    entries: dict[str, str] = {}
    flag = None
    for line in help_text.splitlines():
        if found := re.match(r"^\s{2}(--[a-z0-9][a-z0-9-]*)", line):
            flag = found.group(1)
            entries[flag] = line
        elif flag is not None and line.startswith(" " * 8):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    out = {}
    for flag, entry in entries.items():
        shown = re.findall(r"\(default: ([^()]*)\)", " ".join(entry.split()))
        if shown:
            out[flag] = shown[-1]
    return out


def same_default(a: str, b: str) -> bool:
    """The same value, however each renders a number (0.0 and 0)."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


async def test_every_shared_flag_shows_the_wheels_default() -> None:
    (_, upstream_help, _), (code, ours_help, _) = await asyncio.gather(
        run(str(upstream_bin()), "--help"), run(*OURS, "--help")
    )
    assert code == 0
    upstream, ours = shown_defaults(upstream_help), shown_defaults(ours_help)
    shared = sorted((set(upstream) & set(ours)) - set(PD_ONLY))
    assert len(shared) > 40  # the help pages were parsed
    differ = {f: (upstream[f], ours[f]) for f in shared if not same_default(upstream[f], ours[f])}
    assert differ == {}


async def test_pd_flags_fail_with_one_clear_line() -> None:
    async def attempt(flag: str, value: str | None) -> tuple[str, int, list[str]]:
        argv = [*OURS, "--worker-urls", "http://127.0.0.1:9", "--port", "0", "--prometheus-port", "0", flag]
        code, _, err = await run(*argv, *([] if value is None else [value]))
        return flag, code, [line for line in err.splitlines() if line.strip()]

    results = await asyncio.gather(*(attempt(flag, value) for flag, value in PD_ONLY.items()))
    unclear = {
        flag: lines
        for flag, code, lines in results
        if code == 0 or len(lines) != 1 or not PD_REFUSAL.search(lines[0])
    }
    assert unclear == {}
