"""Generate podplacement's Grafana dashboard with Grafana Labs' ``grafana-foundation-sdk``
(the ``dashboards`` extra of pyproject.toml), never by hand.

It writes the same dashboard JSON to two places:

- ``deploy/optional/monitoring/grafana-dashboard.yaml``: a ConfigMap
  ``podplacement-grafana-dashboard`` labelled ``grafana_dashboard: "1"`` (the label the
  Grafana sidecar of the kube-prometheus-stack and Grafana charts loads dashboards from);
- ``charts/podplacement/dashboards/podplacement.json``: the file the chart's
  ``templates/monitoring-dashboard.yaml`` renders into the same ConfigMap (values
  ``monitoring.enabled`` or ``monitoring.dashboard.enabled``).

Every query reads a metric the product exports (docs/reference/labels-events-metrics.md,
"Metrics"); ``tests/test_dashboard_realcluster.py`` evaluates each of them through a real
Prometheus scraping the product and requires at least one series per query. Queries use
Grafana's ``$__rate_interval`` and the data source variable ``datasource``; labels a scrape
adds are those of prometheus-operator's ServiceMonitors (``pod``, ``namespace``: a metric's
own ``namespace`` label is then ``exported_namespace``).

Usage (from the repository root)::

    python hack/dashboard.py           # write both files
    python hack/dashboard.py --check   # exit 1, naming each stale file, if one differs

``tests/deploy/test_dashboard.py`` runs the check. Without the SDK installed: one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGMAP = REPO / "deploy" / "optional" / "monitoring" / "grafana-dashboard.yaml"
CHART_JSON = REPO / "charts" / "podplacement" / "dashboards" / "podplacement.json"
#: The ConfigMap's name and its one key.
CONFIGMAP_NAME = "podplacement-grafana-dashboard"
DASHBOARD_KEY = "podplacement.json"
UID = "podplacement"
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and its legend (Grafana's ``{{label}}`` template)."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class PanelSpec:
    """A panel: ``kind`` is ``timeseries``, ``stat`` or ``table``; ``unit`` a Grafana unit
    id; ``width`` in grid columns (24 per row)."""

    title: str
    description: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 12


def _rate(metric: str, by: str = "", selector: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{selector}[{RATE}]))"


def _quantiles(bucket: str) -> tuple[Query, ...]:
    return tuple(Query(f"histogram_quantile({q}, sum by (le) (rate({bucket}[{RATE}])))",
                       f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99))


#: (row title, its panels), top to bottom.
ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Placement", (
        PanelSpec("Pods placed per path", "Pods placed per second by the path that placed "
                  "them: at admission by the admission policy in the API server (seen by the "
                  "leader's watch), by the webhook (from its cache, inspected or revalidated), "
                  "by the controller after the gate, and released with the fallback.", (
                      Query(_rate("podplacement_placed_at_admission_total", "path",
                                  '{path="admission"}'), "admission policy"),
                      Query(_rate("podplacement_webhook_admissions_total", "path",
                                  '{path=~"webhook-.*"}'), "{{path}}"),
                      Query(_rate("podplacement_pods_processed_total", "",
                                  '{outcome="set"}'), "controller"),
                      Query(_rate("podplacement_pods_processed_total", "outcome",
                                  '{outcome=~"fallback|no-supported-platform"}'),
                            "controller {{outcome}}"),
                      Query(_rate("podplacement_webhook_released_unplaced_total", "reason"),
                            "webhook released unplaced ({{reason}})"),
                  ), unit="ops"),
        PanelSpec("Pods placed per namespace policy", "Pods that exist and were placed "
                  "under each PodPlacementPolicy (its status.placedPods).", (
                      Query("max by (exported_namespace, policy) "
                            "(podplacement_policy_placed_pods)",
                            "{{exported_namespace}}/{{policy}}"),
                  )),
        PanelSpec("Admission paths taken", "Pod creations by the path they took, as the "
                  "webhook sees them (pods the admission policy placed never reach it).", (
                      Query(_rate("podplacement_webhook_admissions_total", "path"),
                            "{{path}}"),
                  ), unit="ops", width=24),
    )),
    ("Gated pods", (
        PanelSpec("Gated pods now", "Pods carrying the podplacement scheduling gate, and the "
                  "pods queued, delayed or being processed by the leader.", (
                      Query("max(podplacement_gated_pods)", "gated"),
                      Query("max(podplacement_queue_depth)", "queued"),
                  ), width=8),
        PanelSpec("Oldest gated pod", "Age of the oldest gated pod (0: none).", (
                      Query("max(podplacement_oldest_gated_pod_seconds)", "oldest"),
                  ), kind="stat", unit="s", width=4),
        PanelSpec("Time to placement", "Seconds from a pod's creation to the controller's "
                  "ungating patch (pods placed at admission are never gated).",
                  _quantiles("podplacement_ungate_seconds_bucket"), unit="s"),
    )),
    ("Registries", (
        PanelSpec("Image inspections", "Image lookups of the controller per second: answered "
                  "from its cache, fetched from a registry, failed; HTTP requests sent to "
                  "registries and token servers; the admission feed's inspections.", (
                      Query(_rate("podplacement_image_inspection_seconds_count"), "lookups"),
                      Query(_rate("podplacement_image_cache_hits_total"), "cache hits"),
                      Query(_rate("podplacement_image_cache_misses_total"), "cache misses"),
                      Query(_rate("podplacement_registry_requests_total"),
                            "registry HTTP requests"),
                      Query(_rate("podplacement_admission_feed_inspections_total", "result"),
                            "admission feed {{result}}"),
                  ), unit="ops", width=8),
        PanelSpec("Inspection latency", "Seconds per image lookup (cache hits included).",
                  _quantiles("podplacement_image_inspection_seconds_bucket"), unit="s",
                  width=8),
        PanelSpec("Inspection errors", "Failed image lookups per second, and their share.", (
                      Query(_rate("podplacement_image_inspection_errors_total"), "errors"),
                      Query(f"{_rate('podplacement_image_inspection_errors_total')} / "
                            f"clamp_min({_rate('podplacement_image_inspection_seconds_count')}"
                            ", 1e-9)", "share failed"),
                  ), width=8),
    )),
    ("Catalog", (
        PanelSpec("Catalog entries", "Entries of the admission policy's params object "
                  "(ImagePlatformCatalog cluster), as last written.", (
                      Query("max(podplacement_params_entries)", "entries"),
                  ), width=6),
        PanelSpec("Catalog bytes", "Bytes of the catalog as compact JSON (bound 1,000,000).", (
                      Query("max(podplacement_params_bytes)", "bytes"),
                  ), unit="bytes", width=6),
        PanelSpec("Catalog evictions", "Entries dropped, least recently used first, to keep "
                  "within the bounds.", (
                      Query(_rate("podplacement_params_evictions_total"), "evictions"),
                  ), unit="ops", width=6),
        PanelSpec("Params writes", "Writes of the params object per second, by result.", (
                      Query(_rate("podplacement_params_writes_total", "result"), "{{result}}"),
                  ), unit="ops", width=6),
    )),
    ("Exec format errors and escapes", (
        PanelSpec("Exec format exclusions", "(Image digest, platform) pairs placement leaves "
                  "out now, learned from exec format errors.", (
                      Query("max(podplacement_exec_format_exclusions)", "excluded"),
                  ), width=6),
        PanelSpec("Exec format errors", "Containers seen failing with an exec format error "
                  "(by the node's architecture) and the verifications they caused.", (
                      Query(_rate("podplacement_exec_format_errors_total", "arch"),
                            "errors on {{arch}}"),
                      Query(_rate("podplacement_image_verifications_total", "status"),
                            "verifications {{status}}"),
                  ), unit="ops", width=9),
        PanelSpec("Escaped pods", "Pods found bound to a node with no placement record, by "
                  "outcome (docs/escaped-pods.md).", (
                      Query(_rate("podplacement_escaped_pods_total", "outcome"),
                            "{{outcome}}"),
                  ), unit="ops", width=9),
    )),
    ("Webhook and leader", (
        PanelSpec("Webhook latency", "Time spent handling /mutate (the API server waits at "
                  "most timeoutSeconds, 5 s).",
                  _quantiles("podplacement_webhook_request_duration_seconds_bucket"),
                  unit="s", width=8),
        PanelSpec("Webhook requests and outage releases", "AdmissionReviews per second by "
                  "outcome; pods released at admission while no controller runs.", (
                      Query(_rate("podplacement_webhook_requests_total", "outcome"),
                            "{{outcome}}"),
                      Query(f"sum(increase(podplacement_webhook_requests_total"
                            f'{{outcome="released"}}[{RATE}]))', "released in outage"),
                      Query(_rate("podplacement_webhook_errors_total"), "internal errors"),
                  ), unit="ops", width=8),
        PanelSpec("Lease holder", "The controller replica whose podplacement_leader is 1.", (
                      Query("max by (pod, instance) (podplacement_leader) == 1",
                            "{{pod}} {{instance}}", instant=True),
                  ), kind="table", width=8),
    )),
)


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict), built with the SDK.

    Raises:
        ImportError: grafana-foundation-sdk is not installed.
    """
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (dashboard.Dashboard("podplacement").uid(UID).tags(["podplacement"])
             .description("podplacement: pods placed per path, gated pods, registries, the "
                          "image catalog, exec format errors, escapes, the webhook and the "
                          "lease holder. Generated by hack/dashboard.py.")
             .refresh("30s").time("now-1h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus")))
    panels: dict[str, Any] = {"timeseries": timeseries.Panel, "stat": stat.Panel,
                              "table": table.Panel}
    ids = iter(range(1, 1000))
    for title, specs in ROWS:
        board = board.with_row(dashboard.Row(title).id(next(ids)))
        for spec in specs:
            panel = (panels[spec.kind]().id(next(ids)).title(spec.title)
                     .description(spec.description)
                     .datasource(ds).unit(spec.unit).span(spec.width).height(8))
            for i, q in enumerate(spec.queries):
                target = (prometheus.Dataquery().expr(q.expr).legend_format(q.legend)
                          .ref_id(chr(ord("A") + i)).datasource(ds))
                if q.instant:
                    target = target.instant()
                panel = panel.with_target(target)
            board = board.with_panel(panel)
    out: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for panel in out["panels"]:  # the SDK writes "options": null for panels given none
        if panel.get("options") is None:
            panel.pop("options", None)
    return out


def dashboard_json() -> str:
    """The dashboard as indented JSON text with a final newline (what both files hold)."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def configmap(text: str) -> str:
    """The ConfigMap of ``deploy/optional/monitoring`` holding ``text`` (YAML)."""
    import yaml

    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": CONFIGMAP_NAME, "namespace": "podplacement-system",
                        "labels": {"grafana_dashboard": "1"}},
           "data": {DASHBOARD_KEY: text}}
    header = ("# Generated by hack/dashboard.py (grafana-foundation-sdk): do not edit; run\n"
              "# `python hack/dashboard.py`. Grafana's dashboard sidecar loads ConfigMaps "
              "labelled\n# grafana_dashboard: \"1\" (docs/runbooks.md, \"The dashboard\").\n")
    return header + yaml.safe_dump(obj, sort_keys=False, width=100)


def expected() -> dict[Path, str]:
    """Each generated file → its content."""
    text = dashboard_json()
    return {CONFIGMAP: configmap(text), CHART_JSON: text}


def main(argv: list[str] | None = None) -> int:
    """Write the files (0), or with ``--check`` compare them (0 same, 1 stale); 2 when the
    SDK is missing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a generated file differs from what would be written")
    args = parser.parse_args(argv)
    try:
        files = expected()
    except ImportError as exc:
        print(f"dashboard: grafana-foundation-sdk is not installed (pip install -e "
              f"'.[dashboards]'): {exc}", file=sys.stderr)
        return 2
    stale = [p for p, text in files.items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"dashboard: {p.relative_to(REPO)} is stale: run python hack/dashboard.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p], encoding="utf-8")
        print(f"dashboard: wrote {p.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
