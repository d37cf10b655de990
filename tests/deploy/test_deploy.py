"""deploy/: the alert rules and every Grafana expression parse (promtool), every metric they name is in a
live scrape of the router and the emulator, and the Kubernetes manifests hang together."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from integration.helpers import CAPACITY, program_body, wait_until, words
from progrouter.server.cli import add_arguments
from support.factories import EngineFactory, RouterFactory

pytestmark = pytest.mark.timeout(120)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "progrouter-rules.yaml"
GRAFANA = DEPLOY / "grafana" / "progrouter-dashboard.json"
METRIC = re.compile(r"\b(vllm_router_[a-z0-9_]+|vllm:[a-z0-9_]+)")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def promtool_check(path: Path) -> None:
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def grafana_expressions() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> list[str]:
        found = []
        for panel in panels:
            found += [t["expr"] for t in panel.get("targets", [])]
            found += walk(panel.get("panels", []))
        return found

    return walk(json.loads(GRAFANA.read_text())["panels"])


def test_alert_rules_pass_promtool() -> None:
    promtool_check(RULES)


def test_every_grafana_expression_parses(tmp_path: Path) -> None:
    expressions = grafana_expressions()
    assert len(expressions) >= 20
    rules = [{"record": f"progrouter:grafana_check_{i}", "expr": e} for i, e in enumerate(expressions)]
    path = tmp_path / "grafana-exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    promtool_check(path)


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The check above can fail: a malformed expression does not pass."""
    path = tmp_path / "broken.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "a:b", "expr": "sum(("}]}]})
    )
    with pytest.raises(AssertionError):
        promtool_check(path)


def scraped_names(text: str) -> set[str]:
    """Family and sample names of a scrape (a labelled family with no series yet still declares its name)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


async def test_every_metric_used_is_in_a_live_scrape(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router(
        [engine.url],
        {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1},
        prometheus_port=0,
    )
    for i in range(3):
        body = program_body(f"p{i}", words("a", 200), kv_retention_ttl_seconds=0.1)
        async with client.post(router.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
    assert router.metrics_url is not None

    async def scrape() -> set[str]:
        names: set[str] = set()
        for url in (router.metrics_url, engine.url + "/metrics"):
            async with client.get(url) as response:
                names |= scraped_names(await response.text())
        return names

    used = {m for e in rule_expressions() + grafana_expressions() for m in METRIC.findall(e)}
    assert any(m.startswith("vllm:") for m in used) and any("agent_aware" in m for m in used)
    names = await wait_until(scrape, lambda n: "vllm_router_agent_aware_queue_wait_seconds" in n)
    missing = sorted(m for m in used if m not in names and base_name(m) not in names)
    assert not missing, missing


def manifests() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return documents


def test_kubernetes_manifests_hang_together() -> None:
    documents = manifests()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert {
        ("Deployment", "progrouter"),
        ("Service", "progrouter"),
        ("ServiceMonitor", "progrouter"),
    } <= kinds
    assert ("Deployment", "vllm") in kinds
    pods: dict[str, tuple[dict[str, str], set[str]]] = {}
    for d in documents:
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(d), d.get("kind")
        if d["kind"] == "Deployment":
            spec = d["spec"]
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items()
            containers = spec["template"]["spec"]["containers"]
            assert all(c["name"] and c["image"] for c in containers)
            ports = {p["name"] for c in containers for p in c.get("ports", [])}
            pods[d["metadata"]["name"]] = (labels, ports)
    services = {}
    for d in documents:
        if d["kind"] == "Service":
            selector = d["spec"]["selector"]
            matched = [ports for labels, ports in pods.values() if selector.items() <= labels.items()]
            assert matched, f"Service {d['metadata']['name']} selects no Deployment"
            assert all(p["targetPort"] in matched[0] for p in d["spec"]["ports"])
            services[d["metadata"]["name"]] = (
                d["metadata"]["labels"],
                {p["name"] for p in d["spec"]["ports"]},
            )
    for d in documents:
        if d["kind"] == "ServiceMonitor":
            wanted = d["spec"]["selector"]["matchLabels"]
            matched = [ports for labels, ports in services.values() if wanted.items() <= labels.items()]
            assert matched and all(e["port"] in matched[0] for e in d["spec"]["endpoints"])


def test_the_router_manifest_uses_flags_the_router_has() -> None:
    (router,) = [
        d for d in manifests() if d["kind"] == "Deployment" and d["metadata"]["name"] == "progrouter"
    ]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.parse_args(args[1:])  # raises SystemExit on an unknown flag
