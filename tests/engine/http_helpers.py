"""What the emulator's HTTP tests read: filler prompts and the engine's Prometheus samples."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def metrics(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(m: Samples, name: str, engine: int, **labels: str) -> float:
    want = {"engine": str(engine), "model_name": "progrouter-emulated", **labels}
    for (n, lab), v in m.items():
        if n == name and dict(lab) == want:
            return v
    raise KeyError((name, want))
