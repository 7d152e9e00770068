"""The metrics documented in docs/operations.md are the ones the app exports."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Metric

from gateway.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent


def test_documented_metrics_match_the_registry() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(gateway_[a-z_]+)` \|", doc, re.MULTILINE))
    metrics: list[Metric] = list(Metrics().registry.collect())
    exported = {m.name for m in metrics}
    assert documented == exported


def test_no_unbounded_labels() -> None:
    for metric in Metrics().registry.collect():
        for sample in metric.samples:
            assert set(sample.labels) <= {"code", "le"}, sample
