"""An upgrade in place from an earlier release to this checkout, with pods flowing, on the
real control plane: shared by ``tests/test_upgrade_realcluster.py`` (lean) and
``bench/upgrade.py`` (300 pods).

The earlier release runs from its own source tree (``git archive`` of its commit in
``releases.toml``: the same Python environment, its own ``PYTHONPATH`` and working directory),
installed as its README said (``kubectl apply -k deploy/``, twice on a fresh cluster). The
upgrade is what docs/guide/upgrade.md says: ``kubectl apply -k deploy/`` of this checkout, then
the new processes, in the order a Deployment's rolling update runs them (the new webhook and
controller start while the old ones still run; the old controller stops, the new one takes the
Lease; the old webhook stops once the webhook configuration calls the new one). A thread
creates pods all along and watches the config's status.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podplacement.controller.lifecycle import (
    BINDING_PATH,
    CONFIG_PATH,
    POLICY_PATH,
    retired_crd_path,
    retired_object_path,
)
from podplacement.controller.paramswriter import params_path
from podplacement.rules.config import (
    ADMISSION_POLICY_NAME,
    DECISION_ANNOTATION,
    PARAMS_KIND,
    SCHEDULING_GATE,
)
from podplacement.rules.legacy import IMAGE_PLATFORMS_0_1
from podplacement.sandbox.controlplane import ControlPlane
from podplacement.sandbox.product import (
    NAMESPACE,
    Product,
    kubectl,
    start_product,
    wait_webhook_registered,
)

REPO = Path(__file__).resolve().parents[2]
OLD_PARAMS_CRD = retired_crd_path(IMAGE_PLATFORMS_0_1)
OLD_PARAMS = retired_object_path(IMAGE_PLATFORMS_0_1, "cluster", NAMESPACE)


class ReleaseUnavailable(RuntimeError):
    """The earlier release's source tree cannot be had here (no git, or a clone without its
    commit); the message says which."""


def previous_release() -> dict[str, Any]:
    """The last entry of ``releases.toml``: ``{"version", "commit", "date"}``."""
    releases: list[dict[str, Any]] = tomllib.loads(
        (REPO / "releases.toml").read_text())["release"]
    return releases[-1]


def release_tree(commit: str, dest: Path) -> Path:
    """The source tree of ``commit`` unpacked into ``dest`` (``git archive``; the
    repository is only read). Returns ``dest``.

    Raises:
        ReleaseUnavailable: no git, or the commit is not in this clone.
    """
    git = shutil.which("git")
    if git is None:
        raise ReleaseUnavailable("git is not installed")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run([git, "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, timeout=120, check=False)
    if archive.returncode != 0:
        raise ReleaseUnavailable(f"commit {commit} is not in this clone: "
                                 f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True,
                   timeout=120)
    return dest


def install_as_documented(plane: ControlPlane, deploy_dir: Path) -> None:
    """``kubectl apply -k deploy_dir`` as 0.1.0's README said: again once its CRDs are
    Established when the first apply could not create the config yet; the in-cluster
    Deployments are then scaled to 0 (no kubelet here could run them)."""
    kubectl(plane, "apply", "-k", str(deploy_dir), check=False)
    kubectl(plane, "wait", "--for", "condition=Established", "--timeout=60s",
            "-f", str(deploy_dir / "crds"))
    kubectl(plane, "apply", "-k", str(deploy_dir))
    kubectl(plane, "scale", "deployment", "--all", "--replicas=0", "-n", NAMESPACE)


def pod(name: str, image: str) -> dict[str, Any]:
    """A bare pod of one container."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "terminationGracePeriodSeconds": 0}}


def _legacy_binding(binding: dict[str, Any] | None) -> bool:
    """A binding ``podplacement-gate`` that reads 0.1.0's params (no namespace)."""
    if binding is None:
        return False
    ref = (binding.get("spec") or {}).get("paramRef") or {}
    return not ref.get("namespace")


@dataclass
class PodFlow:
    """A thread that creates pods in ``namespace`` every ``interval`` seconds (at most
    ``limit``) and, between two creations, compares the config's status with the binding
    in force: a status saying the policy is not in force while 0.1.0's binding is still
    there is recorded in :attr:`violations`."""

    plane: ControlPlane
    namespace: str
    image: str
    interval: float
    limit: int
    created: list[str] = field(default_factory=list)
    #: ``time.monotonic()`` of each creation
    times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PodFlow:
        """Start the thread; returns self."""
        self._thread = threading.Thread(target=self._run, name="pod-flow", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop creating and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        with self.plane.client() as c:
            while not self._stop.is_set() and len(self.created) < self.limit:
                name = f"flow-{len(self.created):04d}"
                r = c.post(f"/api/v1/namespaces/{self.namespace}/pods",
                           json=pod(name, self.image))
                if r.status_code == 201:
                    self.created.append(name)
                    self.times.append(time.monotonic())
                else:
                    self.failures.append(f"{name}: {r.status_code} {r.text[:200]}")
                self._check_status(c)
                self._stop.wait(self.interval)

    def _check_status(self, c: Any) -> None:
        config = c.get(CONFIG_PATH)
        if config.status_code != 200:
            return
        status = config.json().get("status") or {}
        available = [x for x in status.get("conditions") or [] if x.get("type") == "Available"]
        says_absent = (((status.get("admission") or {}).get("mechanism") == "Webhook")
                       or any("not in force" in str(x.get("message")) for x in available))
        binding = c.get(BINDING_PATH)
        live = binding.json() if binding.status_code == 200 else None
        if says_absent and _legacy_binding(live):
            self.violations.append(
                f"{time.strftime('%H:%M:%S')}: status {status.get('admission')} while the "
                f"binding's paramRef is {(live or {}).get('spec', {}).get('paramRef')}")


@dataclass
class Outcome:
    """What became of the pods of a flow.

    Attributes:
        pods: every pod of the namespace, as last read.
        wrong: pods bound to a node whose (os, arch) the image does not offer.
        escaped: pods bound with no placement record (no decision annotation).
        stranded: pods still gated.
        paths: how the pods were placed (the decision's ``path``; ``controller`` when none).
    """

    pods: list[dict[str, Any]]
    wrong: list[str]
    escaped: list[str]
    stranded: list[str]
    paths: Counter[str]

    @property
    def bound(self) -> int:
        """Pods with a node."""
        return sum(1 for p in self.pods if p["spec"].get("nodeName"))


def outcome(plane: ControlPlane, namespace: str, platforms: set[tuple[str, str]],
            within: float = 60.0) -> Outcome:
    """Wait up to ``within`` seconds until every pod of ``namespace`` is ungated and bound,
    then classify them against ``platforms`` (the image's ``(os, arch)`` pairs)."""
    deadline = time.monotonic() + within
    with plane.client() as c:
        nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
                 for n in c.get("/api/v1/nodes").json()["items"]}
        while True:
            pods = c.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]
            done = all(p["spec"].get("nodeName") for p in pods)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    wrong, escaped, stranded = [], [], []
    paths: Counter[str] = Counter()
    for p in pods:
        name = p["metadata"]["name"]
        if any(g.get("name") == SCHEDULING_GATE for g in p["spec"].get("schedulingGates") or []):
            stranded.append(name)
            continue
        annotation = (p["metadata"].get("annotations") or {}).get(DECISION_ANNOTATION)
        node = p["spec"].get("nodeName")
        if annotation:
            paths[str(json.loads(annotation).get("path") or "controller")] += 1
        if not node:
            continue
        if not annotation:
            escaped.append(name)
        labels = nodes.get(node, {})
        pair = (labels.get("kubernetes.io/os", "linux"), labels.get("kubernetes.io/arch"))
        if pair not in platforms:
            wrong.append(f"{name} on {node} {pair}")
    return Outcome(pods, wrong, escaped, stranded, paths)


def get_or_none(plane: ControlPlane, path: str) -> dict[str, Any] | None:
    """GET ``path`` as admin: the object, or None on 404."""
    with plane.client() as c:
        r = c.get(path)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


def leftovers(plane: ControlPlane) -> list[str]:
    """What of release 0.1.0 is still in the API server: its params CRD or object, or a
    policy or binding that reads them. Empty once the upgrade is complete."""
    found = []
    if get_or_none(plane, OLD_PARAMS_CRD) is not None:
        found.append(f"CRD {IMAGE_PLATFORMS_0_1.name}")
    if get_or_none(plane, OLD_PARAMS) is not None:  # 404 too once its CRD is gone
        found.append(f"{IMAGE_PLATFORMS_0_1.kind} cluster")
    binding = get_or_none(plane, BINDING_PATH)
    if binding is None or _legacy_binding(binding):
        found.append(f"binding {ADMISSION_POLICY_NAME} paramRef "
                     f"{(binding or {}).get('spec', {}).get('paramRef')}")
    policy = get_or_none(plane, POLICY_PATH)
    kind = ((policy or {}).get("spec") or {}).get("paramKind", {}).get("kind")
    if kind != PARAMS_KIND:
        found.append(f"policy {ADMISSION_POLICY_NAME} paramKind {kind}")
    if get_or_none(plane, params_path(NAMESPACE)) is None:
        found.append(f"no {PARAMS_KIND} cluster in {NAMESPACE}")
    return found


def wait_until(check: Callable[[], Any], within: float, every: float = 0.25) -> Any:
    """``check()`` every ``every`` s until it returns something true (returned); after
    ``within`` s, AssertionError with the last value."""
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"not within {within} s; last: {last!r}")


@dataclass
class Upgrade:
    """Timings of :func:`roll` (seconds from the apply, which started at
    ``time.monotonic()`` ``started``)."""

    started: float = 0.0
    applied: float = 0.0
    new_leads: float = 0.0
    complete: float = 0.0


def roll(plane: ControlPlane, running: Product, deploy_dir: Path | None, workdir: Path, *,
         controller_options: list[str], webhook_options: list[str],
         missing: Callable[[], list[str]], rollout_delay: float = 0.0,
         env: dict[str, str] | None = None, cwd: Path | None = None,
         identity: str = "rolled-in-0",
         apply: Callable[[], None] | None = None) -> tuple[Product, Upgrade]:
    """From the release ``running`` to the one of ``deploy_dir`` (its processes from the
    tree ``cwd`` with ``env``; default: this checkout) as a Deployment's rolling update does
    it: ``kubectl apply -k deploy_dir`` (it must succeed), or ``apply()`` instead when given
    (``helm upgrade``: it leaves the Deployments at 0 replicas and the CRDs Established;
    ``deploy_dir`` is then None); ``rollout_delay`` seconds later
    (the new pods' image pull and start, while the running release goes on under the new
    manifests: their RBAC among them) the new webhook and a new controller start (a standby
    while the running one leads); the running controller stops (the new one takes the Lease
    and registers its webhook), then the running webhook; then wait until ``missing()``
    (what the new release has not done yet) is empty. Returns the new product (the caller
    stops it) and the timings.

    Raises:
        AssertionError: the apply failed, or a step did not happen within 60 s.
    """
    started = time.monotonic()
    timing = Upgrade(started)
    if apply is not None:
        apply()
    else:
        assert deploy_dir is not None, "roll: neither deploy_dir nor apply"
        applied = kubectl(plane, "apply", "-k", str(deploy_dir), check=False)
        assert applied.returncode == 0, f"kubectl apply -k {deploy_dir}: {applied.stderr}"
        kubectl(plane, "scale", "deployment", "--all", "--replicas=0", "-n", NAMESPACE)
        kubectl(plane, "wait", "--for", "condition=Established", "--timeout=60s",
                "-f", str(deploy_dir / "crds"))
    timing.applied = time.monotonic() - started
    time.sleep(rollout_delay)
    new = start_product(plane, workdir, controller_options=controller_options,
                        webhook_options=webhook_options, controllers=0,
                        wait_registered=False, env=env, cwd=cwd)
    try:
        new.start_controller(identity)
        for proc in running.controllers:  # the rolling update ends the old controller's pod
            proc.stop()
        wait_webhook_registered(new, 60)
        timing.new_leads = time.monotonic() - started
        running.webhook.stop()
        deadline = time.monotonic() + 60
        while (left := missing()) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert left == [], f"not done after 60 s: {left}"
        timing.complete = time.monotonic() - started
    except BaseException:
        new.stop()
        raise
    return new, timing


def upgrade_in_place(plane: ControlPlane, old: Product, workdir: Path,
                     controller_options: list[str], webhook_options: list[str],
                     rollout_delay: float = 0.0) -> tuple[Product, Upgrade]:
    """The documented upgrade from the previous release ``old`` to this checkout
    (:func:`roll`), done once nothing of the previous release is left (:func:`leftovers`)."""
    return roll(plane, old, REPO / "deploy", workdir, controller_options=controller_options,
                webhook_options=webhook_options, missing=lambda: leftovers(plane),
                rollout_delay=rollout_delay, identity="upgrade-new-0")


def rollback_manifests(tree: Path, dest: Path) -> Path:
    """The previous release's ``deploy/`` copied from its source ``tree`` into ``dest``,
    without its sample config (0.1.0's base held it: applied as is, it would replace the
    operator's config), exactly as docs/guide/upgrade.md, "Roll back to 0.1.0" says. Returns
    the copy's ``deploy`` directory."""
    deploy = dest / "deploy"
    shutil.copytree(tree / "deploy", deploy)
    kustomization = deploy / "base" / "kustomization.yaml"
    lines = kustomization.read_text().splitlines(keepends=True)
    kustomization.write_text("".join(
        line for line in lines if "samples/podplacementconfig.yaml" not in line))
    return deploy


def previous_release_in_force(plane: ControlPlane) -> list[str]:
    """What the previous release (0.1.0) has not put back yet after a rollback: its policy
    reading the cluster-scoped ``ImagePlatforms``, its binding (no namespace in its
    ``paramRef``), that params object. Empty once it is in force."""
    missing = []
    policy = get_or_none(plane, POLICY_PATH)
    kind = ((policy or {}).get("spec") or {}).get("paramKind", {}).get("kind")
    if kind != IMAGE_PLATFORMS_0_1.kind:
        missing.append(f"policy {ADMISSION_POLICY_NAME} paramKind {kind}")
    binding = get_or_none(plane, BINDING_PATH)
    if not _legacy_binding(binding):
        missing.append(f"binding {ADMISSION_POLICY_NAME} paramRef "
                       f"{(binding or {}).get('spec', {}).get('paramRef')}")
    if get_or_none(plane, OLD_PARAMS) is None:
        missing.append(f"{IMAGE_PLATFORMS_0_1.kind} cluster")
    return missing


def previous_release_tree(tmp_path_factory: Any) -> Path:
    """The previous release's tree (:func:`release_tree` of :func:`previous_release`'s
    commit) in a fresh temporary folder; fails under CI (the clone lacks the commit), skips
    elsewhere."""
    import pytest

    from tests.conftest import in_ci

    release = previous_release()
    try:
        return release_tree(release["commit"], tmp_path_factory.mktemp("previous-release"))
    except ReleaseUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI=true but release {release['version']}'s tree is missing: {exc}")
        pytest.skip(f"release {release['version']}'s tree: {exc}")


def products_to_stop() -> Any:
    """A module's shared state ``{"products": [...]}``; every product in it is stopped at
    the end (a generator for a module-scoped fixture)."""
    shared: dict[str, Any] = {"products": []}
    try:
        yield shared
    finally:
        for product in shared["products"]:
            product.stop()

