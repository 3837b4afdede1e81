"""The Grafana dashboard is generated (hack/dashboard.py, grafana-foundation-sdk): the
committed ConfigMap of deploy/optional/monitoring and the chart's copy are exactly what the
generator writes, and both hold the same dashboard. Its queries are evaluated against a real
Prometheus in tests/test_dashboard_realcluster.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGMAP = REPO / "deploy" / "optional" / "monitoring" / "grafana-dashboard.yaml"
CHART_JSON = REPO / "charts" / "podplacement" / "dashboards" / "podplacement.json"


def test_the_committed_dashboard_is_what_the_generator_writes() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "hack" / "dashboard.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_configmap_is_labelled_for_the_grafana_sidecar_and_holds_the_charts_json() -> None:
    obj = yaml.safe_load(CONFIGMAP.read_text())
    assert obj["kind"] == "ConfigMap"
    assert obj["metadata"]["labels"] == {"grafana_dashboard": "1"}
    text = obj["data"]["podplacement.json"]
    assert text == CHART_JSON.read_text()
    board = json.loads(text)
    assert board["uid"] == "podplacement"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Placement", "Gated pods", "Registries", "Catalog",
                    "Exec format errors and escapes", "Webhook and leader"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
