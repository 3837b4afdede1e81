"""``podplacement explain`` and the ``kubectl-podplacement`` plugin at the command line: bad
input is one line on stderr with exit code 2, the registry flags of ``inspect``, the pull
secrets the controller would use, and ``kubectl podplacement explain pod/NAME`` giving the
same report as ``podplacement explain``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from podplacement.rules.config import PlacementConfig
from podplacement.rules.monitor.explain import explain
from tests.controller.conftest import Images, dockerconfig_secret, unique
from tests.controller.numa._build import node
from tests.harness.cli import one_line, run_cli
from tests.harness.kube import KubeEnv
from tests.harness.registry import Registry

BIN = Path(sys.executable).parent




def _pod(image: str = "example.test/app:1", name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": image}], **spec}}


def _write(path: Path, obj: Any) -> Path:
    path.write_text(yaml.safe_dump(obj))
    return path


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No kubeconfig found by the default rules and not in a cluster."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# --- bad input: one line, exit 2 ---------------------------------------------------------

def test_no_nodes_and_no_cluster_is_refused(no_cluster: None, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path / "pod.yaml", _pod())
    code, out, err = run_cli(["explain", str(pod), "--assume-platforms", "linux/amd64"], capsys)
    assert code == 2 and out == ""
    line = one_line(err)
    assert "--nodes" in line and "--kubeconfig" in line


def test_a_cluster_pod_without_a_cluster_is_refused(no_cluster: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["explain", "pod/web", "--assume-platforms", "linux/amd64"], capsys)
    assert code == 2
    assert "pod/web is read from a cluster, but none was found" in one_line(err)


def test_missing_kubeconfig_file_is_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path / "pod.yaml", _pod())
    code, _, err = run_cli(["explain", str(pod), "--kubeconfig", str(tmp_path / "nope"),
                            "--assume-platforms", "linux/amd64"], capsys)
    assert code == 2
    assert str(tmp_path / "nope") in one_line(err)


@pytest.mark.parametrize("doc", [{}, {"kind": "Pod", "spec": {"containers": [{"name": "a"}]}},
                                 {"kind": "Pod", "spec": []}])
def test_a_pod_without_images_is_refused(doc: dict[str, Any], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path / "pod.yaml", doc)
    nodes = _write(tmp_path / "nodes.yaml", node("n1"))
    code, out, err = run_cli(["explain", str(pod), "--nodes", str(nodes)], capsys)
    assert code == 2 and out == ""
    assert "no container images" in one_line(err)


def test_yaml_syntax_error_is_one_line_with_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pod.yaml"
    bad.write_text("kind: Pod\nspec: {containers: [\n  - name: a\nimage: x\n")
    code, _, err = run_cli(["explain", str(bad), "--assume-platforms", "linux/amd64"], capsys)
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"podplacement explain: {bad}: YAML syntax error at line ")
    assert "column" in line


@pytest.mark.parametrize(("argv", "message"), [
    (["{pod}", "--nodes", "{nodes}", "--ca-file", "no-equals"], "--ca-file wants HOST=FILE"),
    (["{pod}", "--nodes", "{nodes}", "--ca-file", "h={missing}"], "missing.pem"),
    (["{pod}", "--nodes", "{nodes}", "--pull-secret", "{missing}"], "missing.pem"),
    (["{pod}", "--nodes", "{nodes}", "--registries-conf", "{missing}"], "missing.pem"),
    (["{pod}", "--nrt", "{nodes}"], "--nrt needs --nodes"),
    (["pod/web", "--nodes", "{nodes}"], "do not combine"),
    (["pod/Bad_Name"], "not a valid pod name"),
    (["{pod}", "--nodes", "{nodes}", "--scoring-strategy", "Best"], "invalid choice"),
    (["{pod}", "--nodes", "{nodes}", "-o", "xml"], "invalid choice"),
])
def test_unusable_flags_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path / "pod.yaml", _pod())
    nodes = _write(tmp_path / "nodes.yaml", node("n1"))
    values = {"{pod}": str(pod), "{nodes}": str(nodes), "{missing}": str(tmp_path / "missing.pem")}
    for key, value in values.items():
        argv = [a.replace(key, value) for a in argv]
    code, _, err = run_cli(["explain", *argv], capsys)
    assert code == 2
    assert message in one_line(err)


def test_cluster_unreachable_is_a_runtime_failure(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    code, _, err = run_cli(["explain", "pod/web", "--kubeconfig", str(kubeconfig),
                            "--assume-platforms", "linux/amd64"], capsys)
    assert code == 1
    assert "cannot reach the API server" in one_line(err)


# --- the fallback sentence -----------------------------------------------------------------

def test_fallback_reason_says_explain_inspected_once() -> None:
    image = "example.test/app:1"
    report = explain(_pod(image), [node("n1")], {}, {image: LookupError("manifest unknown")},
                     PlacementConfig())
    assert report["outcome"] == "fallback"
    assert "attempts" not in report["reason"]
    assert report["reason"].startswith(
        f"image inspection failed ({image}; explain inspected once, the controller would "
        "retry 5 more times, then fall back): ")


def test_fallback_reason_from_the_cli(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path / "pod.yaml", _pod("127.0.0.1:1/team/app:1"))
    nodes = _write(tmp_path / "nodes.yaml", node("n1"))
    code, out, _ = run_cli(["explain", str(pod), "--nodes", str(nodes), "--insecure-registry",
                            "127.0.0.1:1", "-o", "json"], capsys)
    assert code == 0
    reason = json.loads(out)["reason"]
    assert "explain inspected once" in reason and "after 6 attempts" not in reason


# --- registry flags shared with inspect ----------------------------------------------------

def test_pull_secret_and_ca_file_flags(images: Images, basic_registry: Registry,
                                       tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert basic_registry.ca_pem is not None
    ca = tmp_path / "ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    secret = _write(tmp_path / "secret.yaml", dockerconfig_secret("regcred", basic_registry))
    pod = _write(tmp_path / "pod.yaml", _pod(images.private))
    nodes = _write(tmp_path / "nodes.yaml", {"apiVersion": "v1", "kind": "List",
                                             "items": [node("pi", arch="arm64"), node("x86")]})
    base = ["explain", str(pod), "--nodes", str(nodes), "-o", "json",
            "--ca-file", f"{basic_registry.host}={ca}"]
    code, out, err = run_cli([*base, "--pull-secret", str(secret)], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["images"][0]["platforms"] == ["linux/arm64", "linux/ppc64le"]
    assert report["outcome"] == "set"
    # without the secret: the controller's fallback, with the registry's answer
    code, out, _ = run_cli(base, capsys)
    assert code == 0
    assert "401" in json.loads(out)["images"][0]["error"]


def test_registries_conf_flag(images: Images, registry: Registry, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\nblocked = true\n')
    pod = _write(tmp_path / "pod.yaml", _pod(images.arm))
    nodes = _write(tmp_path / "nodes.yaml", node("n1"))
    code, out, _ = run_cli(["explain", str(pod), "--nodes", str(nodes), "--registries-conf",
                            str(conf), "-o", "json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["outcome"] == "fallback" and "blocked" in report["images"][0]["error"].lower()


# --- a cluster: pull secrets as the controller reads them ------------------------------------

def test_cluster_pod_uses_its_image_pull_secrets(
        kube: KubeEnv, unique_namespace: str, images: Images, basic_registry: Registry,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ns = unique_namespace
    assert basic_registry.ca_pem is not None
    ca = tmp_path / "ca.pem"
    ca.write_bytes(basic_registry.ca_pem)
    kube.create(f"/api/v1/namespaces/{ns}/secrets", dockerconfig_secret("regcred", basic_registry))
    name = unique("priv")
    kube.create(f"/api/v1/namespaces/{ns}/pods",
                _pod(images.private, name, imagePullSecrets=[{"name": "regcred"}]))
    code, out, err = run_cli(["explain", f"pod/{name}", "-n", ns, "--kubeconfig",
                              str(kube.kubeconfig), "--ca-file", f"{basic_registry.host}={ca}",
                              "-o", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["pod"] == f"{ns}/{name}"
    assert report["images"][0]["platforms"] == ["linux/arm64", "linux/ppc64le"]
    # the same pod as a manifest, in the namespace given by -n: the same secret is read
    manifest = _pod(images.private, "new", imagePullSecrets=[{"name": "regcred"}])
    pod = _write(tmp_path / "pod.yaml", manifest)
    code, out, err = run_cli(["explain", str(pod), "-n", ns, "--kubeconfig",
                              str(kube.kubeconfig), "--ca-file", f"{basic_registry.host}={ca}",
                              "-o", "json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["pod"] == f"{ns}/new"
    assert report["images"][0]["platforms"] == ["linux/arm64", "linux/ppc64le"]
    # a secret of that name in another namespace does not count (anonymous: 401)
    other = unique("other")
    kube.ensure_namespace(other)
    try:
        code, out, err = run_cli(["explain", str(pod), "-n", other, "--kubeconfig",
                                  str(kube.kubeconfig), "--ca-file",
                                  f"{basic_registry.host}={ca}", "-o", "json"], capsys)
    finally:
        kube.delete(f"/api/v1/namespaces/{other}")
    assert code == 0, err
    assert "401" in json.loads(out)["images"][0]["error"]


def test_missing_cluster_pod_is_a_runtime_failure(kube: KubeEnv, unique_namespace: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["explain", "pod/absent", "-n", unique_namespace, "--kubeconfig",
                            str(kube.kubeconfig), "--assume-platforms", "linux/amd64"], capsys)
    assert code == 1
    assert one_line(err) == f"podplacement explain: pod {unique_namespace}/absent not found"


def _stored_gated_pod(namespace: str = "default") -> dict[str, Any]:
    from podplacement.rules.config import GATE_LABEL, SCHEDULING_GATE

    pod = _pod(schedulingGates=[{"name": SCHEDULING_GATE}])
    pod["metadata"].update(namespace=namespace, labels={GATE_LABEL: "gated"})
    return pod


def test_a_stored_pod_from_a_file_is_said_to_be_gated_not_that_it_would_be(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # as kubectl get pod -o yaml prints it: a uid and a creationTimestamp
    pod = _stored_gated_pod()
    pod["metadata"].update(uid="0b4c-stored", creationTimestamp="2026-01-01T00:00:00Z")
    nodes = _write(tmp_path / "nodes.yaml", {"kind": "List", "items": [node("n1", arch="amd64")]})
    code, out, _ = run_cli(["explain", str(_write(tmp_path / "pod.yaml", pod)), "--nodes",
                            str(nodes), "--assume-platforms", "linux/amd64"], capsys)
    assert code == 0
    assert "Path: gated at admission, waiting for the controller\n" in out


def test_a_stored_pod_from_a_file_is_not_dry_run_again_against_the_cluster(
        kube: KubeEnv, unique_namespace: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    stored = kube.create(f"/api/v1/namespaces/{unique_namespace}/pods",
                         _stored_gated_pod(unique_namespace))
    code, out, _ = run_cli(["explain", str(_write(tmp_path / "pod.yaml", stored)),
                            "--kubeconfig", str(kube.kubeconfig),
                            "--assume-platforms", "linux/amd64", "-o", "json"], capsys)
    assert code == 0
    assert json.loads(out)["path"] == "gated at admission, waiting for the controller"
    # a manifest not created yet is still asked of the server (a dry-run create)
    manifest = _stored_gated_pod(unique_namespace)
    code, out, _ = run_cli(["explain", str(_write(tmp_path / "new.yaml", manifest)),
                            "--kubeconfig", str(kube.kubeconfig),
                            "--assume-platforms", "linux/amd64", "-o", "json"], capsys)
    assert code == 0
    assert json.loads(out)["path"] == "would be gated at admission, waiting for the controller"


# --- the kubectl plugin --------------------------------------------------------------------

def _env(kubeconfig: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                          check=False)


def _plugin() -> str:
    found = shutil.which("kubectl-podplacement", path=_env()["PATH"])
    assert found, ("kubectl-podplacement is not installed: pip install -e . "
                   "(pyproject [project.scripts])")
    return found


def test_kubectl_plugin_explain_matches_podplacement_explain(
        kube: KubeEnv, unique_namespace: str, tmp_path: Path) -> None:
    ns = unique_namespace
    name = unique("plug")
    created = kube.create(f"/api/v1/namespaces/{ns}/pods", _pod("example.test/app:1", name))
    assumed = ["--assume-platforms", "linux/amd64,linux/arm64"]
    kubeconfig = str(kube.kubeconfig)
    env = _env()
    reference = _run([str(BIN / "podplacement"), "explain", f"pod/{name}", "--namespace", ns,
                      "--kubeconfig", kubeconfig, *assumed, "-o", "json"], env)
    assert reference.returncode == 0, reference.stderr
    report = json.loads(reference.stdout)
    assert report["pod"] == f"{ns}/{name}"
    # the same pod as a file gives the same report
    pod_file = _write(tmp_path / "pod.yaml", created)
    from_file = _run([str(BIN / "podplacement"), "explain", str(pod_file), "--kubeconfig",
                      kubeconfig, *assumed, "-o", "json"], env)
    # ... but for the admission path: the pod's is read from it, the file's from a dry run
    from_file_report = json.loads(from_file.stdout)
    assert report.pop("path") == "none: podplacement did not place this pod"
    assert from_file_report.pop("path") == "none: podplacement did not place this pod"
    assert from_file_report == report

    plugin = _plugin()
    for argv in (["explain", f"pod/{name}", "-n", ns, "--kubeconfig", kubeconfig],
                 ["explain", name, f"--namespace={ns}", "--kubeconfig", kubeconfig],
                 ["explain", "-f", str(pod_file), "--kubeconfig", kubeconfig]):
        proc = _run([plugin, *argv, *assumed, "-o", "json"], env)
        assert proc.returncode == 0, (argv, proc.stderr)
        got = json.loads(proc.stdout)
        assert got.pop("path").startswith("none"), argv
        assert got == report, argv
    # kubectl's way of giving the cluster: $KUBECONFIG and --context
    proc = _run([plugin, "explain", f"pod/{name}", "-n", ns, "--context",
                 _current_context(kube.kubeconfig), *assumed, "-o", "json"], _env(kube.kubeconfig))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got.pop("path").startswith("none")
    assert got == report
    # no -n: the namespace of the kubeconfig context, as kubectl does
    config = yaml.safe_load(kube.kubeconfig.read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = ns
    with_ns = tmp_path / "kubeconfig-ns"
    with_ns.write_text(yaml.safe_dump(config))
    proc = _run([plugin, "explain", name, "--kubeconfig", str(with_ns), *assumed, "-o", "json"],
                env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got.pop("path").startswith("none")
    assert got == report
    # the table, too
    table = _run([str(BIN / "podplacement"), "explain", f"pod/{name}", "-n", ns,
                  "--kubeconfig", kubeconfig, *assumed], env)
    proc = _run([plugin, "explain", f"pod/{name}", "-n", ns, "--kubeconfig", kubeconfig,
                 *assumed], env)
    assert proc.stdout == table.stdout and table.stdout.startswith(f"Pod: {ns}/{name}\n")

    kubectl = shutil.which("kubectl", path=env["PATH"])
    if kubectl is None:
        return
    proc = _run([kubectl, "podplacement", "explain", f"pod/{name}", "-n", ns, "--kubeconfig",
                 kubeconfig, *assumed, "-o", "json"], env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got.pop("path").startswith("none")
    assert got == report
    proc = _run([kubectl, "podplacement", "inspect", "UPPER/Case::bad"], env)
    assert proc.returncode == 2
    assert "invalid image reference" in one_line(proc.stderr)


def _current_context(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["current-context"])


def test_kubectl_plugin_inspect_and_errors(registry: Registry, images: Images) -> None:
    plugin = _plugin()
    env = _env()
    proc = _run([plugin, "inspect", "--insecure-registry", registry.host, "--json",
                 images.arm], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["platforms"] == ["linux/arm64"]
    for argv, message in ((["explain", "deployment/web"], "only pods"),
                          (["rollout"], "unknown command"),
                          (["inspect", "UPPER/Case::bad"], "invalid image reference")):
        proc = _run([plugin, *argv], env)
        assert proc.returncode == 2, proc.stderr
        assert message in one_line(proc.stderr)
    proc = _run([plugin, "--help"], env)
    assert proc.returncode == 0 and "kubectl podplacement explain" in proc.stdout


# --- placement policies ----------------------------------------------------------------------

def test_explain_names_the_policy_that_applies(no_cluster: None, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``--policies``: of the policies matching the pod, the highest priority applies; the
    report names it and shows its limit; a pod no policy matches names none."""
    def policy(name: str, priority: int, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "podplacement.io/v1beta1", "kind": "PodPlacementPolicy",
                "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"priority": priority, "podSelector": {"matchLabels": labels},
                         **spec}}

    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump_all([
        policy("web-arm", 20, {"app": "web"}, allowedArchitectures=["arm64"]),
        policy("all-web", 10, {}, allowedArchitectures=["amd64", "arm64"])]))
    nodes = _write(tmp_path / "nodes.yaml", {"apiVersion": "v1", "kind": "List",
                                             "items": [node("n1"), node("n2", arch="arm64")]})
    web = _pod()
    web["metadata"]["labels"] = {"app": "web"}
    args = ["--nodes", str(nodes), "--policies", str(policies),
            "--assume-platforms", "linux/amd64,linux/arm64", "-o", "json"]
    code, out, _ = run_cli(["explain", str(_write(tmp_path / "web.yaml", web)), *args], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["policy"] == {"name": "web-arm", "priority": 20}
    assert report["architectures"] == ["arm64"]
    assert {n["name"]: n["feasible"] for n in report["nodes"]} == {"n1": False, "n2": True}
    code, out, _ = run_cli(["explain", str(_write(tmp_path / "db.yaml", _pod())), *args[:-2]],
                           capsys)
    assert code == 0 and "Policy: all-web (priority 10)" in out
