"""Where the admission policy's kube-apiserver CPU goes: variants of the product's own
MutatingAdmissionPolicy on one real control plane, kube-apiserver CPU per pod created.

One kube-apiserver v1.36.2 + etcd (no scheduler: the pods name ``schedulerName: none``, so
only their creation is measured), deploy/'s CRDs and config, an ImagePlatformCatalog params object
with the two images the pods name. Each *variant* is a policy bound to a namespace of its
own; ``--pods`` pods (default 1,500, two images alternating) are created over 8 keep-alive
connections, and the kube-apiserver CPU they cost (``/proc``, 1 s of tail included) is
divided by the pods. Rounds are interleaved (the order rotates), and each variant's figure is
its CPU per pod minus the ``none`` variant's in the same round (median over rounds), next to
the wall time per pod kube-apiserver spent in its MutatingAdmissionPolicy admission plugin
(its own histogram: far less noisy than CPU on a shared machine):

- ``none``: no policy (the baseline of the round);
- ``product``: the policy the controller creates for deploy/'s config
  (:func:`podplacement.rules.admit.admissionpolicy.desired_policy`), which places every
  pod here (both images are in the params);
- ``patch-const-vars``: the product's policy with every variable a constant of the value it
  takes for these pods: the cost of its JSONPatch expression alone;
- ``vars-const-patch``: the product's variables, all evaluated, then a constant placement:
  the cost of the variables alone;
- ``floor-place``: ``bench/cluster.py``'s constant placement of the product's shape
  (:func:`bench.cluster.floor_policy`), no params: the floor of any policy that writes it.

Usage: ``python bench/policycost.py [--pods 1500] [--rounds 3]``
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") != os.path.join(_ROOT, "bench")]

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench.cluster import CONFIG_PATH, PARAMS_PATH, floor_policy, install_floor  # noqa: E402
from podplacement.rules.admit import admissionpolicy  # noqa: E402
from podplacement.rules.admit.webhookconfig import webhook_namespace_selection  # noqa: E402
from podplacement.sandbox.controlplane import (  # noqa: E402
    ControlPlane,
    locate_assets,
    start_control_plane,
)
from podplacement.sandbox.product import NAMESPACE as PRODUCT_NAMESPACE  # noqa: E402
from podplacement.sandbox.product import install_manifests  # noqa: E402

REPO = Path(_ROOT)
BASE = "/apis/admissionregistration.k8s.io/v1"
IMAGES = {"registry.example.internal/bench/multi:v1": "linux/amd64,linux/arm64",
          "registry.example.internal/bench/amd:v1": "linux/amd64"}
#: The value each variable of the product's policy takes for a pod of the first image with
#: the default config (``patch-const-vars``).
CONSTANTS = {
    "images": "['registry.example.internal/bench/multi:v1']", "table": "{}", "known": "true",
    "free": "true", "policies": "[]", "labels": "{}", "matched": "[]", "hasPolicy": "false",
    "lists": "[['linux/amd64', 'linux/arm64']]", "pairs": "['linux/amd64', 'linux/arm64']",
    "allowedOk": "true", "placed": "true", "archs": "['amd64', 'arm64']", "weights": "{}",
    "preferredArchs": "[]",
    "decision": json.dumps('{"path":"admission","platforms":["linux/amd64","linux/arm64"],'
                           '"oses":["linux"],"archs":["amd64","arm64"],"result":"set",'
                           '"reason":"required architectures amd64, arm64"}'),
}
#: A condition that evaluates every variable the product's patch reads.
EVERY_VARIABLE = ("variables.placed && size(variables.decision) > 0 && "
                  "size(variables.preferredArchs) >= 0 && size(variables.weights) >= 0 && "
                  "variables.allowedOk && size(variables.archs) > 0")

Objects = tuple[dict[str, Any], dict[str, Any]] | None


def variants(config: dict[str, Any]) -> dict[str, Objects]:
    """The policy and binding of every variant (module docstring); ``none`` has none."""
    policy = admissionpolicy.desired_policy(admissionpolicy.placement_config(config))
    binding = admissionpolicy.desired_binding(
        webhook_namespace_selection(config, PRODUCT_NAMESPACE), params_namespace=PRODUCT_NAMESPACE)
    floor = floor_policy("floor-place")[0]
    floor_patch = floor["spec"]["mutations"][0]["jsonPatch"]["expression"]
    const_vars = copy.deepcopy(policy)
    for var in const_vars["spec"]["variables"]:
        var["expression"] = CONSTANTS.get(var["name"], var["expression"])
    vars_only = copy.deepcopy(policy)
    vars_only["spec"]["mutations"][0]["jsonPatch"]["expression"] = (
        f"!({EVERY_VARIABLE}) ? [] : {floor_patch}")
    floor["spec"]["failurePolicy"] = "Ignore"
    floor_binding = copy.deepcopy(binding)
    floor_binding["spec"].pop("paramRef")
    return {"none": None, "product": (policy, binding),
            "patch-const-vars": (const_vars, binding), "vars-const-patch": (vars_only, binding),
            "floor-place": (floor, floor_binding)}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _install(plane: ControlPlane, ns: str, objects: Objects) -> None:
    """Bind ``objects`` to namespace ``ns`` only, then wait until a dry-run pod is mutated
    (:func:`bench.cluster.install_floor`)."""
    if objects is None:
        return
    policy, binding = copy.deepcopy(objects[0]), copy.deepcopy(objects[1])
    policy["metadata"] = {"name": "variant"}
    binding["metadata"] = {"name": "variant"}
    binding["spec"]["policyName"] = "variant"
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
    install_floor(plane, ns, objects=[policy, binding], image=next(iter(IMAGES)), namespace=ns)


def _uninstall(plane: ControlPlane, limit: float = 10.0) -> None:
    with plane.client() as c:
        c.delete(f"{BASE}/mutatingadmissionpolicybindings/variant")
        c.delete(f"{BASE}/mutatingadmissionpolicies/variant")
        deadline = time.monotonic() + limit
        while (c.get(f"{BASE}/mutatingadmissionpolicies/variant").status_code != 404
               and time.monotonic() < deadline):
            time.sleep(0.1)
    time.sleep(1.0)  # the API server's informer drops the policy


_PLUGIN_SECONDS = re.compile(
    r'^apiserver_admission_controller_admission_duration_seconds_sum\{([^}]*)\} (\S+)$', re.M)


def _policy_plugin_seconds(plane: ControlPlane) -> float:
    """Seconds kube-apiserver spent in its MutatingAdmissionPolicy admission plugin so far
    (``apiserver_admission_controller_admission_duration_seconds_sum``: wall time)."""
    with plane.client() as c:
        text = c.get("/metrics").text
    return sum(float(v) for labels, v in _PLUGIN_SECONDS.findall(text)
               if 'name="MutatingAdmissionPolicy"' in labels)


def measure(plane: ControlPlane, ns: str, pods: int,
            connections: int = 8) -> tuple[float, float]:
    """kube-apiserver CPU milliseconds per pod for creating ``pods`` pods in ``ns``, and the
    milliseconds per pod spent in its MutatingAdmissionPolicy plugin (wall time)."""
    images = list(IMAGES)
    bodies = [json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i}"},
                          "spec": {"schedulerName": "none", "containers": [
                              {"name": "c", "image": images[i % len(images)]}]}}).encode()
              for i in range(pods)]
    clients = [plane.client() for _ in range(connections)]
    pid = plane.processes["kube-apiserver"].pid
    try:
        time.sleep(1.0)
        plugin = _policy_plugin_seconds(plane)
        before = _cpu_seconds(pid)

        def send(i: int) -> None:
            resp = clients[i % connections].post(
                f"/api/v1/namespaces/{ns}/pods", content=bodies[i],
                headers={"Content-Type": "application/json"})
            if resp.status_code != 201:
                raise RuntimeError(f"create refused: {resp.status_code} {resp.text[:200]}")

        with ThreadPoolExecutor(connections) as pool:
            list(pool.map(send, range(pods)))
        time.sleep(1.0)
        cpu = (_cpu_seconds(pid) - before) * 1000 / pods
        return cpu, (_policy_plugin_seconds(plane) - plugin) * 1000 / pods
    finally:
        for client in clients:
            client.close()


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print each variant's added kube-apiserver CPU per pod."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--pods", type=int, default=1500, help="pods per variant and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-policycost-"))
    plane = start_control_plane(locate_assets(), work / "plane", scheduler=False)
    try:
        install_manifests(plane, REPO / "deploy")
        with plane.client() as c:
            config = c.get(CONFIG_PATH).json()
            c.post(PARAMS_PATH, json={
                "apiVersion": "podplacement.io/v1beta1", "kind": "ImagePlatformCatalog",
                "metadata": {"name": "cluster", "namespace": PRODUCT_NAMESPACE},
                "spec": {"images": IMAGES}}).raise_for_status()
        all_variants = variants(config)
        names = list(all_variants)
        per_pod: dict[str, list[float]] = {name: [] for name in names}
        in_plugin: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                ns = f"r{r}-{name}"
                with plane.client() as c:
                    c.post("/api/v1/namespaces",
                           json={"metadata": {"name": ns}}).raise_for_status()
                _install(plane, ns, all_variants[name])
                try:
                    cpu, plugin = measure(plane, ns, args.pods)
                finally:
                    if all_variants[name] is not None:
                        _uninstall(plane)
                per_pod[name].append(cpu)
                in_plugin[name].append(plugin)
                print(f"round {r + 1} {name:<18} {cpu:6.2f} ms/pod CPU, {plugin:6.3f} ms/pod "
                      "in the policy plugin", file=sys.stderr, flush=True)
        print(f"\nkube-apiserver CPU per pod created, {args.pods} pods per variant, "
              f"{args.rounds} rounds; added = minus 'none' in the same round")
        print(f"{'variant':<18}{'CPU ms/pod':>11}  {'added (per round)':<44}"
              f"{'policy plugin ms/pod (wall, per round)'}")
        for name in names:
            added = [v - b for v, b in zip(per_pod[name], per_pod["none"], strict=True)]
            rounds = ", ".join(f"{a:+.2f}" for a in added)
            added_text = f"{statistics.median(added):+.2f} ({rounds})"
            print(f"{name:<18}{statistics.median(per_pod[name]):>11.2f}  {added_text:<44}"
                  f"{statistics.median(in_plugin[name]):.3f} ("
                  + ", ".join(f"{v:.3f}" for v in in_plugin[name]) + ")")
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
