"""The demo's cluster contents as plain Kubernetes JSON: nodes, NodeResourceTopologies, the
PodPlacementConfig ``cluster``, the namespace with its pull secret, and the sample pods.

Pure: every function returns new dicts and does no I/O, so tests can check the objects and the
orchestration (:mod:`podplacement.demo.run`) only sends them. Each sample pod comes with an
:class:`Expectation` derived by hand from the images the demo pushes (see
:mod:`podplacement.demo.seed`), which the report compares with what the product did.

Nodes: five fake nodes of four architectures (labels ``kubernetes.io/arch``, ``os``,
``hostname``), and, when this machine runs one, the real amd64 node of
:mod:`podplacement.sandbox.realnode`, where the pods placed on amd64 run (their containers print
one line, then sleep). The fake amd64 nodes then stand in for NUMA hardware only: they carry
:data:`SIMULATED_TAINT`, which the two Guaranteed NUMA pods tolerate, so that every other pod
placed on amd64 is bound to the real node. When the emulated arm64 node of
:mod:`podplacement.sandbox.realnode` runs too, the fake ``demo-arm64`` node carries the same
taint (no sample pod tolerates it there: it has no NodeResourceTopology), so that the pods placed
on arm64 only (``arm64-only``, and ``multi-arch-arm64`` by its own ``nodeSelector``) run on the
real arm64 node, each its own image entry. The two amd64 nodes carry a NodeResourceTopology
(``topology.node.k8s.io/v1alpha2``) with two zones of type ``Node`` named ``node-0``/``node-1``
and Topology Manager policy ``single-numa-node`` (container scope), with different free
capacity, so that a Guaranteed pod asking for 6 CPUs fits one node only and one asking for 12
fits nowhere (the largest zone has 8 free) until :func:`freed_capacity_patch` reports 14 free
CPUs in a zone of the other amd64 node.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import (
    API_VERSION,
    ARCH_LABEL,
    CONFIG_KIND,
    CONFIG_NAME,
    HOSTNAME_LABEL,
    NRT_GROUP,
    NRT_VERSION,
    OS_LABEL,
)

DEMO_NAMESPACE = "demo"
PULL_SECRET_NAME = "private-registry"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_DEMO = "podplacement-demo"

#: Repositories and tags the demo pushes (see :mod:`podplacement.demo.seed`).
MULTI = "demo/busybox:multi"
LIST = "demo/busybox:list"
S390X = "demo/busybox:s390x"
ARM64 = "demo/busybox:arm64"
WINONLY = "demo/winonly:1"
PRIVATE = "private/busybox:1"

#: Platforms behind each tag (the facts the expectations follow from).
IMAGE_PLATFORMS: dict[str, tuple[str, ...]] = {
    MULTI: ("linux/amd64", "linux/arm64/v8", "linux/ppc64le", "linux/s390x"),
    LIST: ("linux/amd64", "linux/arm64/v8"),
    S390X: ("linux/s390x",),
    ARM64: ("linux/arm64/v8",),
    WINONLY: ("windows/amd64",),
    PRIVATE: ("linux/amd64", "linux/arm64/v8"),
}

#: Scoring weights put into the config (``plugins.nodeAffinityScoring``).
PREFERRED_WEIGHTS: dict[str, int] = {"amd64": 50, "arm64": 30}

#: The taint of the fake NUMA nodes while a real amd64 node runs (only the NUMA pods, which
#: the real node's 2 CPUs could not hold, tolerate it).
SIMULATED_TAINT: dict[str, str] = {"key": "demo.podplacement.io/simulated", "value": "numa",
                                   "effect": "NoSchedule"}
#: What the containers run: one line on stdout (what ``kubectl logs`` shows of a pod on the
#: real node), then sleep; an init container's line, then it ends (else the pod would never
#: start its app container).
APP_COMMAND = ("sh", "-c", 'echo "$(hostname): busybox on $(uname -m)"; exec sleep 3600')
INIT_COMMAND = ("sh", "-c", 'echo "$(hostname): setup done on $(uname -m)"')

#: CPU (cores) / memory asked by the two Guaranteed NUMA pods.
NUMA_FITS_ONE_CPU = 6
NUMA_FITS_NONE_CPU = 12
NUMA_MEMORY = "4Gi"


@dataclass(frozen=True, slots=True)
class DemoZone:
    """Free resources of one NUMA zone: ``cpu`` in cores, ``memory`` a quantity string."""

    cpu: int
    memory: str


@dataclass(frozen=True, slots=True)
class DemoNode:
    """A fake node: name (= hostname label), architecture, and its NUMA zones when it
    publishes a NodeResourceTopology (empty: no NRT)."""

    name: str
    architecture: str
    zones: tuple[DemoZone, ...] = ()


NODES: tuple[DemoNode, ...] = (
    DemoNode("demo-amd64-a", "amd64", (DemoZone(4, "8Gi"), DemoZone(2, "8Gi"))),
    DemoNode("demo-amd64-b", "amd64", (DemoZone(8, "16Gi"), DemoZone(6, "16Gi"))),
    DemoNode("demo-arm64", "arm64"),
    DemoNode("demo-ppc64le", "ppc64le"),
    DemoNode("demo-s390x", "s390x"),
)

#: Allocatable of every fake node (large enough that only NUMA alignment limits the pods);
#: each of a node's two zones has half of it.
NODE_CPU = 32
NODE_MEMORY = "64Gi"
NODE_PODS = 110


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the product should do with a sample pod.

    Attributes:
        archs: architectures of the required ``kubernetes.io/arch In`` expression (None: no
            such expression expected).
        hostnames: ``kubernetes.io/hostname In`` values expected (empty: none).
        no_supported_platform: the unsatisfiable marker requirement is expected.
        waiting: the pod is expected to stay gated waiting for NUMA resources.
        event: the Event reason expected among the pod's events.
    """

    archs: tuple[str, ...] | None
    hostnames: tuple[str, ...] = ()
    no_supported_platform: bool = False
    waiting: bool = False
    event: str = "PlacementDecided"


@dataclass(frozen=True, slots=True)
class Workload:
    """A sample pod (``pod`` is the Pod dict to create), what it shows, and the expectation."""

    name: str
    what: str
    pod: Mapping[str, Any]
    expect: Expectation


@dataclass(frozen=True, slots=True)
class DemoRegistries:
    """Where the images live: ``public`` and ``private`` are ``host:port`` reference domains;
    ``username``/``password`` open the private one (basic auth)."""

    public: str
    private: str
    username: str
    password: str

    def ref(self, tag: str) -> str:
        """The full reference of one of the tags above (private ones on the private host)."""
        host = self.private if tag == PRIVATE else self.public
        return f"{host}/{tag}"


def namespace_object(name: str = DEMO_NAMESPACE) -> dict[str, Any]:
    """A Namespace; carries ``kubernetes.io/metadata.name`` (the real API server sets it too,
    and the webhook's namespaceSelector reads it) and :data:`MANAGED_BY_LABEL`."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {NAMESPACE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY_DEMO},
        },
    }


def made_by_demo(obj: Mapping[str, Any]) -> bool:
    """True when ``obj`` carries the demo's ``app.kubernetes.io/managed-by`` label (the demo
    deletes only what it made)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY_DEMO)


def service_account_object(namespace: str = DEMO_NAMESPACE) -> dict[str, Any]:
    """The ``default`` ServiceAccount (kube-controller-manager creates it in a real cluster;
    the demo runs none, and the ServiceAccount admission plugin needs it to admit pods)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": namespace},
    }


def node_object(node: DemoNode) -> dict[str, Any]:
    """A Node with the well-known labels (no status: the API server drops status on create)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                ARCH_LABEL: node.architecture,
                OS_LABEL: "linux",
                HOSTNAME_LABEL: node.name,
            },
        },
    }


def node_status(node: DemoNode) -> dict[str, Any]:
    """The ``status`` to write through ``nodes/<name>/status`` (merge patch) so a scheduler
    sees a Ready node with allocatable resources (what a kubelet would report)."""
    resources = {"cpu": str(NODE_CPU), "memory": NODE_MEMORY, "pods": str(NODE_PODS)}
    return {
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "podplacement demo node (no kubelet)",
                }
            ],
            "nodeInfo": {"architecture": node.architecture, "operatingSystem": "linux"},
        }
    }


def node_taints(node: DemoNode, real_node: bool,
                real_arm64: bool = False) -> list[dict[str, str]] | None:
    """The node's ``spec.taints``: :data:`SIMULATED_TAINT` on a node with NUMA zones while a
    real node runs, and on the arm64 node while the real arm64 node runs (``real_arm64``),
    else none (None: the merge patch that clears the ``not-ready`` taint the
    TaintNodesByCondition admission plugin adds to a node created without a kubelet)."""
    tainted = (real_node and bool(node.zones)) or (real_arm64 and node.architecture == "arm64")
    return [dict(SIMULATED_TAINT)] if tainted else None


def node_objects() -> list[dict[str, Any]]:
    """The five demo Nodes."""
    return [node_object(n) for n in NODES]


def nrt_object(node: DemoNode) -> dict[str, Any]:
    """The NodeResourceTopology of ``node`` (name = node name; zones ``node-0``, ``node-1`` of
    type ``Node``; policy ``single-numa-node``, scope ``container``; NodeResourceTopology API
    v1alpha2 with the ``topologyManagerPolicy``/``Scope`` attributes).

    Raises:
        ValueError: the node has no zones.
    """
    if not node.zones:
        raise ValueError(f"node {node.name} has no NUMA zones")
    count = len(node.zones)
    zones = []
    for i, zone in enumerate(node.zones):
        zones.append(
            {
                "name": f"node-{i}",
                "type": "Node",
                "costs": [
                    {"name": f"node-{j}", "value": 10 if i == j else 20} for j in range(count)
                ],
                "resources": [
                    {
                        "name": "cpu",
                        "capacity": NODE_CPU // count,
                        "allocatable": NODE_CPU // count,
                        "available": zone.cpu,
                    },
                    {
                        "name": "memory",
                        "capacity": "32Gi",
                        "allocatable": "32Gi",
                        "available": zone.memory,
                    },
                ],
            }
        )
    return {
        "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node.name},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    }


def nrt_objects() -> list[dict[str, Any]]:
    """NodeResourceTopologies of the nodes that have zones (the two amd64 nodes)."""
    return [nrt_object(n) for n in NODES if n.zones]


#: The second act: pods on this node finish, so its zone ``node-0`` reports this many free
#: CPUs, enough for the pod that waited (and only there: no pod was placed on this node, so
#: no in-flight reservation holds part of it).
FREED_NODE = NODES[0]
FREED_CPU = 14
WAITING_POD = "numa-fits-nowhere"
AFTER_FREEING = Expectation(("amd64", "arm64", "ppc64le", "s390x"),
                            hostnames=(FREED_NODE.name,))


def freed_capacity_patch() -> dict[str, Any]:
    """A JSON merge patch for :data:`FREED_NODE`'s NodeResourceTopology: ``zones`` (a list,
    so replaced whole) with :data:`FREED_CPU` CPUs available in ``node-0``."""
    zones = list(FREED_NODE.zones)
    zones[0] = DemoZone(FREED_CPU, zones[0].memory)
    freed = DemoNode(FREED_NODE.name, FREED_NODE.architecture, tuple(zones))
    return {"zones": nrt_object(freed)["zones"]}


def placement_config(*, max_wait_seconds: int = 45) -> dict[str, Any]:
    """The PodPlacementConfig ``cluster``: architecture preferences (scoring weights), NUMA
    placement on with ``nodesWithoutTopology: Deny`` (so only nodes publishing an NRT can take
    Guaranteed pods) and a short ``maxWaitSeconds`` so a pod that fits nowhere is not kept
    gated long. Field names follow ``deploy/crds/podplacementconfig.yaml``."""
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "metadata": {"name": CONFIG_NAME},
        "spec": {
            "logVerbosity": "Normal",
            "plugins": {
                "nodeAffinityScoring": {
                    "enabled": True,
                    "platforms": [
                        {"architecture": arch, "weight": weight}
                        for arch, weight in PREFERRED_WEIGHTS.items()
                    ],
                }
            },
            "imageInspection": {"cacheTTL": "10m", "maxRetries": 2, "registryTimeoutSeconds": 5},
            "topology": {
                "enabled": True,
                "scoringStrategy": "LeastAllocated",
                "maxCandidateNodes": 4,
                "nodesWithoutTopology": "Deny",
                "maxWaitSeconds": max_wait_seconds,
                "unsatisfiable": "Wait",
            },
        },
    }


def pull_secret(registries: DemoRegistries, namespace: str = DEMO_NAMESPACE) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` Secret with the private registry's credentials
    (the ``auths`` map keyed by ``host:port``, as ``kubectl create secret docker-registry``
    writes it)."""
    token = base64.b64encode(f"{registries.username}:{registries.password}".encode()).decode()
    config = {
        "auths": {
            registries.private: {
                "username": registries.username,
                "password": registries.password,
                "auth": token,
            }
        }
    }
    data = base64.b64encode(json.dumps(config).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": PULL_SECRET_NAME, "namespace": namespace},
        "data": {".dockerconfigjson": data},
    }


def _container(name: str, image: str, cpu: int | None = None,
               command: tuple[str, ...] = APP_COMMAND) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image, "command": list(command)}
    if cpu is not None:
        amounts = {"cpu": str(cpu), "memory": NUMA_MEMORY}
        container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    return container


def _pod(
    name: str,
    containers: list[dict[str, Any]],
    *,
    init: list[dict[str, Any]] | None = None,
    pull_secrets: list[str] | None = None,
    namespace: str = DEMO_NAMESPACE,
    numa: bool = False,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
    }
    if numa:
        spec["tolerations"] = [{**SIMULATED_TAINT, "operator": "Equal"}]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if init:
        spec["initContainers"] = init
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "podplacement-demo"}},
        "spec": spec,
    }


ALL_ARCHS = ("amd64", "arm64", "ppc64le", "s390x")


def workloads(registries: DemoRegistries, namespace: str = DEMO_NAMESPACE) -> list[Workload]:
    """The nine sample pods, in the order they are created and reported."""
    r = registries.ref
    return [
        Workload(
            "multi-arch",
            "OCI index of 4 architectures (+ attestations)",
            _pod("multi-arch", [_container("app", r(MULTI))], namespace=namespace),
            Expectation(ALL_ARCHS),
        ),
        Workload(
            "single-arch",
            "single-arch Docker v2 image (s390x)",
            _pod("single-arch", [_container("app", r(S390X))], namespace=namespace),
            Expectation(("s390x",)),
        ),
        Workload(
            "arm64-only",
            "single-arch Docker v2 image (arm64): runs on an arm64 node",
            _pod("arm64-only", [_container("app", r(ARM64))], namespace=namespace),
            Expectation(("arm64",)),
        ),
        Workload(
            "multi-arch-arm64",
            "the 4-arch index again, on arm64 by the pod's own nodeSelector",
            _pod("multi-arch-arm64", [_container("app", r(MULTI))], namespace=namespace,
                 node_selector={ARCH_LABEL: "arm64"}),
            # the pod's own kubernetes.io/arch selector decides: podplacement adds no arch
            # requirement of its own (only os In [linux])
            Expectation(None),
        ),
        Workload(
            "mixed-init",
            "init image (manifest list amd64+arm64) + app image (4 archs): intersection",
            _pod(
                "mixed-init",
                [_container("app", r(MULTI))],
                init=[_container("setup", r(LIST), command=INIT_COMMAND)],
                namespace=namespace,
            ),
            Expectation(("amd64", "arm64")),
        ),
        Workload(
            "no-common-platform",
            "init s390x + app windows-only: no platform runs both",
            _pod(
                "no-common-platform",
                [_container("app", r(WINONLY))],
                init=[_container("setup", r(S390X), command=INIT_COMMAND)],
                namespace=namespace,
            ),
            Expectation(None, no_supported_platform=True, event="NoSupportedPlatform"),
        ),
        Workload(
            "private-image",
            "image behind basic auth, pulled with the pod's imagePullSecret",
            _pod(
                "private-image",
                [_container("app", r(PRIVATE))],
                pull_secrets=[PULL_SECRET_NAME],
                namespace=namespace,
            ),
            Expectation(("amd64", "arm64")),
        ),
        Workload(
            "numa-fits-one",
            f"Guaranteed {NUMA_FITS_ONE_CPU} CPUs: one NUMA zone can hold it on one node only",
            _pod(
                "numa-fits-one",
                [_container("app", r(MULTI), cpu=NUMA_FITS_ONE_CPU)],
                namespace=namespace,
                numa=True,
            ),
            Expectation(ALL_ARCHS, hostnames=("demo-amd64-b",)),
        ),
        Workload(
            "numa-fits-nowhere",
            f"Guaranteed {NUMA_FITS_NONE_CPU} CPUs: no NUMA zone is that large yet",
            _pod(
                "numa-fits-nowhere",
                [_container("app", r(MULTI), cpu=NUMA_FITS_NONE_CPU)],
                namespace=namespace,
                numa=True,
            ),
            Expectation(None, waiting=True, event="WaitingForNUMAResources"),
        ),
    ]
