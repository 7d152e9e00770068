"""The metrics documented in docs/operations.md are the ones the app exports."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Metric

from gateway.engines.upstream.engine import UpstreamEngine
from gateway.ops.metrics import Metrics
from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_documented_metrics_match_the_registry() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(gateway_[a-z0-9_]+)` \|", doc, re.MULTILINE))
    metrics: list[Metric] = list(Metrics().registry.collect())
    exported = {m.name for m in metrics} | {m.name for m in _upstream_metrics()}
    assert documented == exported


def _upstream_metrics() -> list[Metric]:
    """The upstream engine's per-replica families (exported in that mode)."""
    settings = load_settings(
        None, overrides={"engine": "upstream", "upstream": {"urls": ["http://a:1"]}}, environ={}
    )
    return list(UpstreamEngine(settings).collectors()[0].collect())  # type: ignore[attr-defined]


def test_upstream_labels_are_bounded() -> None:
    for metric in _upstream_metrics():
        for sample in metric.samples:
            assert set(sample.labels) <= {"replica", "kind", "state", "le"}, sample
            assert sample.labels.get("replica") == "http://a:1"


def test_no_unbounded_labels() -> None:
    for metric in Metrics().registry.collect():
        for sample in metric.samples:
            assert set(sample.labels) <= {"code", "le"}, sample
