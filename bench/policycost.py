"""Where the admission policy's kube-apiserver time goes: variants of the product's own
MutatingAdmissionPolicy on one real control plane, the cost per pod created of each step.

One kube-apiserver v1.36.2 + etcd (no scheduler: the pods name ``schedulerName: none``, so
only their creation is measured), deploy/'s CRDs and config, an ImagePlatformCatalog params
object with the two images the pods name. Each *variant* is a policy bound to a namespace of
its own (``failurePolicy: Fail``: a variant that errs is refused at installation, never
measured as a cheap no-op); ``--pods`` pods (default 1,500, the two images alternating) are
created over 8 keep-alive connections. Per variant and round, three figures per pod: the
kube-apiserver CPU (``/proc``, 1 s of tail included), the wall time its
MutatingAdmissionPolicy admission *plugin* spent (``apiserver_admission_controller_admission_
duration_seconds{name="MutatingAdmissionPolicy"}``: matching, the object's conversion to and
from its typed form, the policy, the patch), and the time of the policy's own *check*
(``apiserver_mutating_admission_policy_check_duration_seconds``: its CEL and the patch
applied). Rounds are interleaved (the order rotates); medians over rounds. The variants form
a chain, each one step over the one before, so each difference is one step's cost:

- ``none``: no policy (the baseline of the round);
- ``noop``: a policy that matches every pod and patches nothing (an empty list of
  JSONPatch, :data:`NO_PATCH`): the machinery;
- ``floor-label``: one JSONPatch op adding a label: a patch applied and the pod re-encoded;
- ``floor-same``: the constant ops of the decision ``warm`` writes, picked by image
  (:func:`bench.cluster.same_decision_ops`, the product's Python rules): the patch a placed
  pod needs, computed by nothing;
- ``params``: the product's policy (its params and variables declared, but none read)
  with ``floor-same``'s patch: what the params object costs;
- ``var:<name>``, one per variable of the generated policy in its order: every variable up
  to this one evaluated (``size([dyn(variables.a), ...]) >= 0 ? (P) : (P)``, P
  ``floor-same``'s patch; a variable's value is kept once evaluated, so the difference to
  the one before is this variable's own cost). The names are read from
  :func:`podplacement.rules.admit.admissionpolicy.desired_policy`, whatever it generates;
- ``product``: the product's policy as generated: its patch expression over the last
  ``var:`` is the cost of building the patch from the variables instead of a constant.

Then, off the chain:

- ``floor-lookup``: the product's policy with what only other pods need made constant
  (:func:`lookup_policy`: the images of ``spec.containers`` only; no
  ``Always`` scan, no node-affinity or selector check, no namespace policy, no tolerations):
  the lookup of each image in the catalog (the split, two map indexings, the set) and the
  patch built from the set, as the product builds it. It writes the product's decision for
  these pods (checked on each variant's dry-run pod at installation): ``floor-lookup`` over
  ``floor-same`` is what looking the image up costs, ``product`` over ``floor-lookup`` what
  the checks for other pods cost;
- ``conditions``: the product's policy with its skip rules also declared as
  ``matchConditions`` (as the policy had them before they moved into its JSONPatch): what
  ``matchConditions`` cost;
- ``webhook-selector`` and ``webhook-condition``: the product's policy and the webhook
  configuration as the controller writes it while the policy places
  (:func:`podplacement.rules.admit.webhookconfig.desired_webhook_configuration`, its
  ``objectSelector`` skipping the pods labelled ``scheduling-gate=removed``), pointed at an
  address nobody serves (a pod that reached it would be admitted after a refused connection,
  ``failurePolicy: Ignore``; the placed pods never do); then with the same skip written as
  a ``matchConditions`` entry instead of the selector (the shape before). Their fourth
  figure is the wall time of the MutatingAdmissionWebhook plugin per pod.

Usage: ``python bench/policycost.py [--pods 1500] [--rounds 3] [--variants a,b,...]``
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

from bench.cluster import (  # noqa: E402
    CONFIG_PATH,
    PARAMS_PATH,
    cel_patch_op,
    floor_policy,
    lookup_policy,
    same_decision_ops,
)
from podplacement.rules.admit import admissionpolicy  # noqa: E402
from podplacement.rules.admit.imageparams import catalog_maps  # noqa: E402
from podplacement.rules.admit.predicates import cel_string  # noqa: E402
from podplacement.rules.admit.webhookconfig import (  # noqa: E402
    desired_webhook_configuration,
    webhook_namespace_selection,
)
from podplacement.rules.config import GATE_LABEL, GATE_LABEL_REMOVED, WEBHOOK_NAME  # noqa: E402
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

#: A variant's objects: the policy and its binding, and a MutatingWebhookConfiguration or
#: None; None for no policy at all.
Objects = tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None


#: An empty list of JSONPatch (a bare ``[]`` is ``list(dyn)``, which the API server refuses).
NO_PATCH = "[JSONPatch{op: 'test', path: '/kind', value: 'Pod'}].filter(p, false)"


def pod_body(i: int) -> dict[str, Any]:
    """Pod ``p-i`` of a variant: no scheduler, one container of image ``i % 2``."""
    images = list(IMAGES)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i}"},
            "spec": {"schedulerName": "none",
                     "containers": [{"name": "c", "image": images[i % len(images)]}]}}


def floor_same_patch(config: dict[str, Any]) -> str:
    """The CEL of ``floor-same``: per image, the constant ops of the decision the product
    writes for a pod of :func:`pod_body` (:func:`bench.cluster.same_decision_ops`)."""
    expression = "[]"
    for i, image in reversed(list(enumerate(IMAGES))):
        ops = same_decision_ops(pod_body(i), IMAGES, config)
        expression = (f"object.spec.containers[0].image == {cel_string(image)} ? ["
                      + ", ".join(cel_patch_op(op) for op in ops) + f"] : {expression}")
    return expression


def _with_patch(policy: dict[str, Any], expression: str) -> dict[str, Any]:
    out = copy.deepcopy(policy)
    out["spec"]["failurePolicy"] = "Fail"
    out["spec"]["mutations"] = [{"patchType": "JSONPatch",
                                 "jsonPatch": {"expression": expression}}]
    return out


def variants(config: dict[str, Any]) -> dict[str, Objects]:
    """The policy and binding of every variant (module docstring), in chain order; ``none``
    has none."""
    policy = admissionpolicy.desired_policy(admissionpolicy.placement_config(config))
    policy["spec"]["failurePolicy"] = "Fail"
    binding = admissionpolicy.desired_binding(
        webhook_namespace_selection(config, PRODUCT_NAMESPACE), params_namespace=PRODUCT_NAMESPACE)
    bare_policy, bare_binding = floor_policy("floor-label")
    label = bare_policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
    same = floor_same_patch(config)
    out: dict[str, Objects] = {
        "none": None,
        "noop": (_with_patch(bare_policy, NO_PATCH), bare_binding, None),
        "floor-label": (_with_patch(bare_policy, label), bare_binding, None),
        "floor-same": (_with_patch(bare_policy, same), bare_binding, None),
        "params": (_with_patch(policy, same), binding, None),
    }
    names = [str(v["name"]) for v in policy["spec"].get("variables") or []]
    for k in range(1, len(names) + 1):
        forced = ", ".join(f"dyn(variables.{n})" for n in names[:k])
        out[f"var:{names[k - 1]}"] = (
            _with_patch(policy, f"size([{forced}]) >= 0 ? ({same}) : ({same})"), binding, None)
    out["product"] = (policy, binding, None)
    out["floor-lookup"] = (lookup_policy(policy), binding, None)
    conditions = copy.deepcopy(policy)
    conditions["spec"]["matchConditions"] = [dict(c) for c in admissionpolicy.MATCH_CONDITIONS]
    out["conditions"] = (conditions, binding, None)
    out["webhook-selector"] = (policy, binding, variant_webhook(config, condition=False))
    out["webhook-condition"] = (policy, binding, variant_webhook(config, condition=True))
    return out


#: The matchCondition ``webhook-condition`` skips the placed pods with (the objectSelector's
#: rule in CEL, :func:`podplacement.rules.admit.webhookconfig.webhook_called`).
SKIP_PLACED_CONDITION = (f"object.metadata.?labels[?{cel_string(GATE_LABEL)}].orValue('') "
                         f"!= {cel_string(GATE_LABEL_REMOVED)}")


def variant_webhook(config: dict[str, Any], *, condition: bool) -> dict[str, Any]:
    """The webhook configuration the controller writes while the policy places, pointed at
    ``https://127.0.0.1:1`` (nobody serves it); with ``condition`` its objectSelector
    replaced by :data:`SKIP_PLACED_CONDITION` as a ``matchConditions`` entry."""
    webhook = desired_webhook_configuration(
        config, ca_bundle=None, url="https://127.0.0.1:1/mutate",
        own_namespace=PRODUCT_NAMESPACE, skip_placed=True)
    if condition:
        (hook,) = webhook["webhooks"]
        hook["objectSelector"] = {}
        hook["matchConditions"] = [{"name": "not-placed", "expression": SKIP_PLACED_CONDITION}]
    return webhook


def placement_of(pod: dict[str, Any]) -> dict[str, Any]:
    """What a policy wrote into a dry-run pod: its affinity, tolerations, labels and
    annotations (the decision's ``catalog`` uid included: one params object here)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return {"affinity": spec.get("affinity"), "tolerations": spec.get("tolerations"),
            "labels": meta.get("labels"), "annotations": meta.get("annotations")}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_CHECKS = re.compile(
    r'^apiserver_mutating_admission_policy_check_(total|duration_seconds_sum)\{([^}]*)\} (\S+)$',
    re.M)
_PLUGIN_SECONDS = re.compile(
    r'^apiserver_admission_controller_admission_duration_seconds_sum\{([^}]*)\} (\S+)$', re.M)


def _metrics(plane: ControlPlane) -> tuple[float, float, float, float]:
    """kube-apiserver's counters so far: the policy ``variant``'s checks and their seconds
    (``apiserver_mutating_admission_policy_check_total`` and ``..._duration_seconds_sum``,
    every error type), and the seconds of its MutatingAdmissionPolicy and
    MutatingAdmissionWebhook plugins
    (``apiserver_admission_controller_admission_duration_seconds_sum``, wall time)."""
    with plane.client() as c:
        text = c.get("/metrics").text
    checks = seconds = 0.0
    for kind, labels, value in _CHECKS.findall(text):
        if 'policy="variant"' in labels:
            if kind == "total":
                checks += float(value)
            else:
                seconds += float(value)
    plugins = _PLUGIN_SECONDS.findall(text)
    plugin = sum(float(v) for labels, v in plugins if 'name="MutatingAdmissionPolicy"' in labels)
    webhook = sum(float(v) for labels, v in plugins
                  if 'name="MutatingAdmissionWebhook"' in labels)
    return checks, seconds, plugin, webhook


def _install(plane: ControlPlane, ns: str, objects: Objects,
             limit: float = 30.0) -> dict[str, Any] | None:
    """Bind ``objects`` to namespace ``ns`` only, then wait until a dry-run pod there is
    admitted and the policy counted a check (the API server has it); returns that dry-run
    pod as admitted (None for no policy).

    Raises:
        RuntimeError: not in force within ``limit`` seconds (a variant whose CEL errs is
            refused: ``failurePolicy: Fail``), with the API server's answer.
    """
    if objects is None:
        return None
    if objects[2] is not None:
        _install_webhook(plane, ns, objects[2], limit)
    policy, binding = copy.deepcopy(objects[0]), copy.deepcopy(objects[1])
    policy["metadata"] = {"name": "variant"}
    binding["metadata"] = {"name": "variant"}
    binding["spec"]["policyName"] = "variant"
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
    with plane.client() as c:
        c.post(f"{BASE}/mutatingadmissionpolicies", json=policy).raise_for_status()
        c.post(f"{BASE}/mutatingadmissionpolicybindings", json=binding).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            before = _metrics(plane)[0]
            got = c.post(f"/api/v1/namespaces/{ns}/pods", params={"dryRun": "All"},
                         json=pod_body(0))
            if got.status_code == 201 and _metrics(plane)[0] > before:
                answer: dict[str, Any] = got.json()
                return answer
            if time.monotonic() > deadline:
                raise RuntimeError(f"the variant is not in force within {limit} s: "
                                   f"{got.status_code} {got.text[:400]}")
            time.sleep(0.2)


_WEBHOOK_CALLS = re.compile(
    r'^apiserver_admission_webhook_admission_duration_seconds_count\{([^}]*)\} (\S+)$', re.M)


def _webhook_calls(plane: ControlPlane) -> float:
    """How many times kube-apiserver called (or tried) the variant's webhook so far."""
    with plane.client() as c:
        text = c.get("/metrics").text
    return sum(float(v) for labels, v in _WEBHOOK_CALLS.findall(text)
               if f'name="{WEBHOOK_NAME}"' in labels)


def _install_webhook(plane: ControlPlane, ns: str, webhook: dict[str, Any],
                     limit: float) -> None:
    """Create the variant's webhook configuration for namespace ``ns`` only and wait until
    the API server calls it for a pod the policy gates (an image not in the params object:
    the connection is refused, the pod admitted, ``failurePolicy: Ignore``).

    Raises:
        RuntimeError: not called within ``limit`` seconds.
    """
    webhook = copy.deepcopy(webhook)
    webhook["metadata"] = {"name": "variant"}
    webhook["webhooks"][0]["namespaceSelector"] = {
        "matchLabels": {"kubernetes.io/metadata.name": ns}}
    probe = pod_body(0)
    probe["spec"]["containers"][0]["image"] = "registry.example.internal/bench/unknown:v1"
    with plane.client() as c:
        c.post(f"{BASE}/mutatingwebhookconfigurations", json=webhook).raise_for_status()
        deadline = time.monotonic() + limit
        while True:
            before = _webhook_calls(plane)
            c.post(f"/api/v1/namespaces/{ns}/pods", params={"dryRun": "All"}, json=probe)
            if _webhook_calls(plane) > before:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the variant's webhook is not called within {limit} s")
            time.sleep(0.2)


def _uninstall(plane: ControlPlane, limit: float = 10.0) -> None:
    with plane.client() as c:
        c.delete(f"{BASE}/mutatingwebhookconfigurations/variant")
        c.delete(f"{BASE}/mutatingadmissionpolicybindings/variant")
        c.delete(f"{BASE}/mutatingadmissionpolicies/variant")
        deadline = time.monotonic() + limit
        while (c.get(f"{BASE}/mutatingadmissionpolicies/variant").status_code != 404
               and time.monotonic() < deadline):
            time.sleep(0.1)
    time.sleep(1.0)  # the API server's informer drops the policy


def measure(plane: ControlPlane, ns: str, pods: int,
            connections: int = 8) -> tuple[float, float, float, float]:
    """For creating ``pods`` pods of :func:`pod_body` in ``ns``, per pod in milliseconds:
    kube-apiserver's CPU, the wall time of its MutatingAdmissionPolicy plugin, of the
    policy ``variant``'s checks, and of its MutatingAdmissionWebhook plugin."""
    bodies = [json.dumps(pod_body(i)).encode() for i in range(pods)]
    clients = [plane.client() for _ in range(connections)]
    pid = plane.processes["kube-apiserver"].pid
    try:
        time.sleep(1.0)
        _, check0, plugin0, webhook0 = _metrics(plane)
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
        _, check1, plugin1, webhook1 = _metrics(plane)
        return (cpu, (plugin1 - plugin0) * 1000 / pods, (check1 - check0) * 1000 / pods,
                (webhook1 - webhook0) * 1000 / pods)
    finally:
        for client in clients:
            client.close()


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(names: list[str], cpu: dict[str, list[float]], plugin: dict[str, list[float]],
           check: dict[str, list[float]], pods: int, rounds: int,
           webhook: dict[str, list[float]] | None = None) -> None:
    """Print per variant its figures (medians over rounds; CPU as added over ``none`` in
    the same round) and the step over the variant before it in the chain; then the costs
    off the chain (the lookup, the checks, ``matchConditions``, the webhook configuration)
    for the variants run. ``webhook``: the MutatingAdmissionWebhook plugin's ms per pod."""
    webhook = webhook or {n: [0.0] * len(cpu[n]) for n in names}
    added = {n: [v - b for v, b in zip(cpu[n], cpu["none"], strict=True)] for n in names}
    print(f"\nkube-apiserver per pod created, {pods} pods per variant, {rounds} round(s); "
          "medians over rounds; CPU added = minus 'none' in the same round; step = minus the "
          "variant above (the cost of what this one adds)")
    print(f"{'variant':<24}{'CPU +ms':>9}{'plugin ms':>11}{'check ms':>10}{'webhook ms':>11}"
          f"{'step CPU':>10}{'step plugin':>12}{'step check':>11}  CPU added per round")
    prev: str | None = None
    for n in names:
        line = (f"{n:<24}{_med(added[n]):>+9.3f}{_med(plugin[n]):>11.3f}"
                f"{_med(check[n]):>10.3f}{_med(webhook[n]):>11.3f}")
        if prev is None:
            line += f"{'':>10}{'':>12}{'':>11}"
        else:
            # steps per round, then their median (steadier than a difference of medians)
            def step(series: dict[str, list[float]], a: str = n, b: str = prev) -> float:
                return _med([x - y for x, y in zip(series[a], series[b], strict=True)])
            line += f"{step(cpu):>+10.3f}{step(plugin):>+12.3f}{step(check):>+11.3f}"
        print(line + "  " + ", ".join(f"{a:+.2f}" for a in added[n]))
        prev = n
    var = [n for n in names if n.startswith("var:")]
    if {"noop", "floor-label", "floor-same", "params", "product"} <= set(names) and var:
        def diff(a: str, b: str, series: dict[str, list[float]]) -> float:
            return _med([x - y for x, y in zip(series[a], series[b], strict=True)])

        print("\nwhere the policy plugin's time goes (ms/pod, wall; CPU in brackets):")
        for what, a, b in (
                ("the machinery (a policy, an empty patch)", "noop", "none"),
                ("one JSONPatch op applied, the pod re-encoded", "floor-label", "noop"),
                ("the whole decision's ops instead of one label", "floor-same", "floor-label"),
                ("params and variables declared", "params", "floor-same"),
                ("every variable evaluated", var[-1], "params"),
                ("the patch built from the variables, not constant", "product", var[-1]),
                ("the product over floor-same", "product", "floor-same")):
            print(f"  {what:<52}{diff(a, b, plugin):>+8.3f}  ({diff(a, b, cpu):+.3f})")
    if {"floor-same", "floor-lookup", "product"} <= set(names):
        def diff2(a: str, b: str, series: dict[str, list[float]]) -> float:
            return _med([x - y for x, y in zip(series[a], series[b], strict=True)])

        print("\nthe lookup and the checks (ms/pod, wall; CPU in brackets):")
        for what, a, b in (
                ("looking the image up (floor-lookup over floor-same)", "floor-lookup",
                 "floor-same"),
                ("the checks for other pods (product over floor-lookup)", "product",
                 "floor-lookup")):
            print(f"  {what:<56}{diff2(a, b, plugin):>+8.3f}  ({diff2(a, b, cpu):+.3f})")
    admission = {n: [p + w for p, w in zip(plugin[n], webhook[n], strict=True)] for n in names}
    off_chain = [(what, a, b) for what, a, b in (
        ("the skip rules as matchConditions too (conditions over product)", "conditions",
         "product"),
        ("the webhook configuration, objectSelector (webhook-selector over product)",
         "webhook-selector", "product"),
        ("the same skip as a matchCondition (webhook-condition over webhook-selector)",
         "webhook-condition", "webhook-selector")) if {a, b} <= set(names)]
    if off_chain:
        print("\nmatchConditions and the webhook configuration (ms/pod of admission, both "
              "plugins, wall; CPU in brackets):")
        for what, a, b in off_chain:
            steps = [x - y for x, y in zip(admission[a], admission[b], strict=True)]
            cpus = [x - y for x, y in zip(cpu[a], cpu[b], strict=True)]
            print(f"  {what:<78}{_med(steps):>+8.3f}  ({_med(cpus):+.3f})")


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print each variant's figures and steps."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--pods", type=int, default=1500, help="pods per variant and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--variants", default="",
                    help="comma-separated subset of the variants (default: all; 'none' is "
                         "always run)")
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
                "spec": catalog_maps(IMAGES)}).raise_for_status()
        all_variants = variants(config)
        wanted = {v for v in args.variants.split(",") if v}
        unknown = wanted - set(all_variants)
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; choose from {list(all_variants)}")
        names = [n for n in all_variants if not wanted or n in wanted or n == "none"]
        cpu: dict[str, list[float]] = {name: [] for name in names}
        plugin: dict[str, list[float]] = {name: [] for name in names}
        check: dict[str, list[float]] = {name: [] for name in names}
        webhook: dict[str, list[float]] = {name: [] for name in names}
        written: dict[str, dict[str, Any]] = {}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                ns = f"r{r}-{name.replace(':', '-').lower()}"
                with plane.client() as c:
                    c.post("/api/v1/namespaces",
                           json={"metadata": {"name": ns}}).raise_for_status()
                dry = _install(plane, ns, all_variants[name])
                if dry is not None:
                    written.setdefault(name, placement_of(dry))
                try:
                    figures = measure(plane, ns, args.pods)
                finally:
                    if all_variants[name] is not None:
                        _uninstall(plane)
                for series, value in zip((cpu, plugin, check, webhook), figures, strict=True):
                    series[name].append(value)
                print(f"round {r + 1} {name:<24} {figures[0]:6.2f} ms/pod CPU, "
                      f"{figures[1]:6.3f} plugin, {figures[2]:6.3f} check, "
                      f"{figures[3]:6.3f} webhook", file=sys.stderr, flush=True)
        report(names, cpu, plugin, check, args.pods, args.rounds, webhook)
        if "floor-lookup" in written and "product" in written:
            same = written["floor-lookup"] == written["product"]
            print(f"\nfloor-lookup wrote the product's decision into pod 0: "
                  f"{'yes' if same else 'NO'}")
            if not same:
                print(f"  product:      {json.dumps(written['product'], sort_keys=True)}")
                print(f"  floor-lookup: {json.dumps(written['floor-lookup'], sort_keys=True)}")
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
