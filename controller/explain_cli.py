"""The ``podplacement explain`` subcommand: read a pod, the nodes and their NRTs, inspect the
images (or assume their platforms) and print the dry-run report of :mod:`rules.monitor.explain`.

The pod is a manifest file (``-``: stdin) or ``pod/NAME`` read from the cluster. Nodes and
NRTs are files as ``kubectl get ... -o yaml`` prints them (``--nodes``/``--nrt``: a ``List``,
a single object or multi-document YAML), or come from a live cluster (Nodes and
``topology.node.k8s.io/v1alpha2`` NodeResourceTopologies; a missing NRT CRD means no NRTs).
The cluster is found as ``podplacement controller`` finds it: ``--kubeconfig`` (and
``--context``), else ``$KUBECONFIG`` / ``~/.kube/config`` when present, else in-cluster; with
none of these and no ``--nodes`` explain refuses (exit 2) rather than decide on no nodes.

With a cluster the credentials are the controller's own
(:meth:`controller.reconciler.Reconciler.credentials`: the pod's ``imagePullSecrets`` from
its namespace, then the config's global pull secret). Like the controller, explain does not
read service accounts: the ServiceAccount admission plugin copies the service account's
``imagePullSecrets`` into a pod that names none when it is created, so ``pod/NAME`` carries
them, while a manifest not created yet is taken as written. ``--pull-secret`` files are added
to those; the registry flags are those of ``podplacement inspect``
(:func:`imageinspect.cli.add_registry_arguments`).

Without ``--config`` the defaults apply, with NUMA placement enabled when any NRT was read.
With a cluster, the platforms its controller learned are wrong (the live config's
``status.execFormatErrorMonitor.excluded``, docs/exec-format-errors.md) are left out as the
controller leaves them out, unless ``--config`` brings exclusions of its own.
Each image is inspected once; a failure is decided as the controller decides it after its
last retry. Exit status: 0 report printed, 1 the cluster could not be read, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from podplacement.cliargs import is_dns_label, is_dns_subdomain, one_line, yaml_error_line
from podplacement.controller.bindingfeed import BINDINGS_SELECTOR
from podplacement.imageinspect import OS_VERSION_RE
from podplacement.imageinspect.cli import (
    RegistrySettings,
    add_registry_arguments,
    registry_settings,
)
from podplacement.kubeclient import (
    ApiError,
    KubeAPI,
    default_kubeconfig,
    pod_path,
    resource_path,
    secret_path,
)
from podplacement.rules.config import (
    CONFIG_NAME,
    POLICY_KIND,
    ConfigError,
    ExcludedPlatform,
    PlacementConfig,
    config_or_defaults,
)
from podplacement.rules.monitor.explain import OUTPUTS, explain, render
from podplacement.rules.numa import STRATEGIES, QuantityError
from podplacement.rules.place.decision import unique_images
from podplacement.rules.place.plan import inflight_from_pods
from podplacement.rules.policy import rank

log = logging.getLogger(__name__)

#: Namespace file of the in-cluster service account.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class InputError(Exception):
    """An input file or option cannot be used (message says which and why)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Platform:
    os: str
    architecture: str
    variant: str | None = None
    os_version: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _AssumedImage:
    """Stand-in for ``imageinspect.ImageInfo`` under ``--assume-platforms``."""

    reference: str
    digest: str
    platforms: tuple[_Platform, ...]


def load_objects(path: str) -> list[dict[str, Any]]:
    """Objects in a YAML/JSON file: the items of ``List``-kind documents, other documents as
    they are; empty documents are skipped.

    Raises:
        InputError: unreadable file or not YAML (one line, with line and column).
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        docs = list(yaml.safe_load_all(text))
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or one_line(exc)}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file ({exc.reason})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: {yaml_error_line(exc)}") from None
    out: list[dict[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InputError(f"{path}: expected Kubernetes objects, got {type(doc).__name__}")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            out.extend(i for i in doc["items"] if isinstance(i, dict))
        else:
            out.append(doc)
    return out


def parse_platforms(text: str) -> tuple[_Platform, ...]:
    """``linux/amd64,linux/arm64/v8,windows/amd64@10.0.17763.1`` -> platforms (an
    ``@os.version`` as an image index's Windows entry carries it, docs/pools/windows-builds.md).
    Raises InputError on another shape."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        base, at, version = item.partition("@")
        parts = base.split("/")
        if len(parts) not in (2, 3) or not all(parts) or (
                at and not OS_VERSION_RE.fullmatch(version)):
            raise InputError(f"--assume-platforms: {item!r} is not "
                             "os/architecture[/variant][@os.version]")
        out.append(_Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else None,
                             version or None))
    return tuple(out)


def _by_name(objs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str((o.get("metadata") or {}).get("name", "")): o for o in objs}


#: ``kind/NAME`` prefixes that name a pod in the cluster (as kubectl accepts them).
POD_PREFIXES = ("pod/", "pods/", "po/")


def pod_reference(text: str) -> str | None:
    """The pod name of ``pod/NAME`` (also ``pods/``, ``po/``), else None (a file path)."""
    for prefix in POD_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix):]
    return None


class ClusterError(Exception):
    """The cluster could not be read (runtime failure: exit status 1)."""


def _api_error(what: str, exc: ApiError) -> ClusterError:
    if exc.status == 0:
        return ClusterError(f"{what}: cannot reach the API server: {one_line(exc.message)}")
    return ClusterError(f"{what}: {exc.status} {exc.reason}: {one_line(exc.message)}")


def _context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    """The namespace of the kubeconfig context (``--context`` or the current one), or of
    the in-cluster service account; None when it names none."""
    if kubeconfig is None:
        try:
            return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or None
        except OSError:
            return None
    from podplacement.kubeclient import kubeconfig_contexts

    try:
        contexts, active = kubeconfig_contexts(kubeconfig)
    except Exception:  # the loader raises several unrelated types; connecting reports it
        return None
    chosen = next((c for c in contexts or [] if c.get("name") == context), None) \
        if context else active
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else None


def find_kubeconfig(kubeconfig: str | None, pod_ref: str | None = None) -> str | None:
    """The kubeconfig file ``podplacement controller`` would use: ``kubeconfig``, else
    ``$KUBECONFIG`` or ``~/.kube/config`` when present; None means in-cluster. ``pod_ref``
    (``pod/NAME``) only words the error.

    Raises:
        InputError: the file named does not exist, or there is no configuration at all (not
            in a cluster either); the message says what was tried.
    """
    from kubernetes.aio import config as kconfig

    path = kubeconfig or default_kubeconfig(kconfig.KUBE_CONFIG_DEFAULT_LOCATION)
    if path is not None and not Path(path).is_file():
        source = "--kubeconfig" if kubeconfig else "$KUBECONFIG"
        raise InputError(f"{source} {path}: no such file")
    if path is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        tried = "no --kubeconfig, $KUBECONFIG or ~/.kube/config, not in a cluster"
        if pod_ref:
            raise InputError(f"{pod_ref} is read from a cluster, but none was found ({tried})")
        raise InputError(f"no nodes to decide on: give --nodes NODES.yaml (and --nrt), or a "
                         f"cluster with --kubeconfig (none found: {tried})")
    return path


async def connect(path: str | None, context: str | None) -> KubeAPI:
    """Connect with the kubeconfig file ``path`` (None: in-cluster; see
    :func:`find_kubeconfig`) and ``context``.

    Raises:
        InputError: the configuration is unusable.
    """
    try:
        return await KubeAPI.from_kubeconfig(path, context=context,
                                             user_agent="podplacement-explain")
    except Exception as exc:  # the loader raises several unrelated types
        raise InputError(f"kubeconfig {path or '(in-cluster)'}: {one_line(exc)}") from None


async def read_cluster_objects(api: KubeAPI
                               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and NRTs of the cluster (raw JSON; a missing NRT CRD means no NRTs).

    Raises:
        ClusterError: the cluster cannot be read.
    """
    from podplacement.controller.app import NODES_PATH, NRTS_PATH

    try:
        nodes, _ = await api.list_all(NODES_PATH)
    except ApiError as exc:
        raise _api_error("listing nodes", exc) from None
    try:
        nrts, _ = await api.list_all(NRTS_PATH)
    except ApiError as exc:
        if exc.status != 404:
            raise _api_error("listing NodeResourceTopologies", exc) from None
        nrts = []  # the NodeResourceTopology CRD is not installed
    return nodes, nrts


async def learned_exclusions(api: KubeAPI) -> tuple[ExcludedPlatform, ...]:
    """The exclusions the cluster's controller published (the PodPlacementConfig
    ``cluster``'s ``status.execFormatErrorMonitor.excluded``, as every placement path reads
    them); none when the config is missing, unreadable or turns learning off."""
    from podplacement.rules.config import CONFIG_PLURAL, GROUP, VERSION

    try:
        obj = await api.request("GET", resource_path(GROUP, VERSION, CONFIG_PLURAL,
                                                     name=CONFIG_NAME))
    except ApiError:
        return ()
    return config_or_defaults(obj)[0].excluded


async def read_policies(api: KubeAPI, namespace: str) -> list[dict[str, Any]]:
    """The PodPlacementPolicies of ``namespace`` (none when the CRD is not installed).

    Raises:
        ClusterError: the policies cannot be read (e.g. 403).
    """
    from podplacement.rules.config import GROUP, POLICY_PLURAL, VERSION

    try:
        items, _ = await api.list_all(
            resource_path(GROUP, VERSION, POLICY_PLURAL, namespace=namespace))
    except ApiError as exc:
        if exc.status == 404:
            return []  # the PodPlacementPolicy CRD is not installed
        raise _api_error(f"listing PodPlacementPolicies of {namespace}", exc) from None
    return list(items)


def _load_policies(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """``--policies``: the PodPlacementPolicies of a file (None without the option)."""
    if not args.policies:
        return None
    return [o for o in load_objects(args.policies) if o.get("kind") == POLICY_KIND]


async def _read_pod(api: KubeAPI, namespace: str, name: str) -> dict[str, Any]:
    try:
        return await api.request("GET", pod_path(namespace, name))
    except ApiError as exc:
        if exc.not_found:
            raise ClusterError(f"pod {namespace}/{name} not found") from None
        raise _api_error(f"reading pod {namespace}/{name}", exc) from None


async def cluster_credentials(api: KubeAPI, pod: Mapping[str, Any],
                              config: PlacementConfig) -> list[Any]:
    """The credentials the controller would use for ``pod``: the very same Secrets
    (:func:`rules.podspec.pull_secret_refs`: its ``imagePullSecrets`` from its
    namespace, then the config's global pull secret), read by
    :class:`imageinspect.PullSecretReader`. A failed read is logged and gives no
    credentials, as in the controller."""
    from podplacement.imageinspect import PullSecretReader
    from podplacement.rules.podspec import pull_secret_refs

    try:
        return list(await PullSecretReader(api, secret_path=secret_path).credentials(
            pull_secret_refs(pod, config)))
    except ApiError as exc:
        log.warning("reading pull secrets failed, inspecting anonymously: %s", exc)
        return []


async def inspect_images(pod: Mapping[str, Any], settings: RegistrySettings,
                         credentials: Sequence[Any], request_timeout: float) -> dict[str, Any]:
    """Inspect every distinct image of ``pod`` once (``imagePullPolicy: Always`` honoured
    like the controller) → ImageInfo or the exception."""
    from podplacement.imageinspect import Inspector

    images = unique_images(pod)
    async with Inspector(registries=settings.registries, ca_bundles=settings.ca_bundles,
                         timeout=request_timeout) as inspector:
        async def one(image: str, pull_always: bool) -> Any:
            try:
                return await inspector.inspect(image, credentials, pull_always=pull_always)
            except Exception as exc:  # reported per image, like the controller does
                return exc
        results = await asyncio.gather(*(one(i, pa) for i, pa in images.items()))
    return dict(zip(images, results, strict=True))


def _load_config(args: argparse.Namespace) -> PlacementConfig | None:
    if not args.config:
        return None
    objs = load_objects(args.config)
    if not objs:
        raise InputError(f"{args.config}: no PodPlacementConfig")
    try:
        return PlacementConfig.from_object(objs[0])
    except ConfigError as exc:
        raise InputError(f"{args.config}: {one_line(exc)}") from None


def _config(args: argparse.Namespace, loaded: PlacementConfig | None,
            have_nrts: bool) -> PlacementConfig:
    if loaded is not None:
        cfg = loaded
    else:
        cfg = PlacementConfig()
        cfg = dataclasses.replace(
            cfg, topology=dataclasses.replace(cfg.topology, enabled=have_nrts))
    if args.scoring_strategy:
        cfg = dataclasses.replace(
            cfg, topology=dataclasses.replace(cfg.topology, scoring_strategy=args.scoring_strategy))
    return cfg


def _file_pod(path: str) -> dict[str, Any]:
    pods = [o for o in load_objects(path) if o.get("kind", "Pod") == "Pod"]
    if not pods:
        raise InputError(f"{path}: no Pod found")
    return pods[0]


@dataclasses.dataclass
class _Inputs:
    """Everything explain needs, read and checked before the cluster or a registry is
    contacted (so argument errors come first)."""

    pod: dict[str, Any] | None
    pod_name: str | None
    cluster: bool
    kubeconfig: str | None
    config: PlacementConfig | None
    policies: list[dict[str, Any]] | None
    assumed: tuple[_Platform, ...] | None
    settings: RegistrySettings | None


def _inputs(args: argparse.Namespace) -> _Inputs:
    """Check the arguments and read the files. Raises InputError."""
    name = pod_reference(args.pod)
    if name is not None and not is_dns_subdomain(name):
        raise InputError(f"{args.pod}: {name!r} is not a valid pod name")
    if args.namespace is not None and not is_dns_label(args.namespace):
        raise InputError(f"--namespace: {args.namespace!r} is not a valid namespace name")
    files = bool(args.nodes or args.nrt)
    if files and (args.kubeconfig or args.context or name is not None):
        what = "--kubeconfig/--context" if (args.kubeconfig or args.context) else args.pod
        raise InputError(f"{what} reads the cluster: do not combine it with --nodes/--nrt")
    if args.nrt and not args.nodes:
        raise InputError("--nrt needs --nodes")
    assumed = parse_platforms(args.assume_platforms) if args.assume_platforms else None
    try:
        settings = None if assumed else registry_settings(args)
    except (OSError, ValueError) as exc:
        raise InputError(one_line(exc)) from None
    config = _load_config(args)
    pod = None
    if name is None:
        pod = _file_pod(args.pod)
        _check_pod(args.pod, pod)
    kubeconfig = None if files else find_kubeconfig(args.kubeconfig,
                                                    args.pod if name is not None else None)
    return _Inputs(pod, name, not files, kubeconfig, config, _load_policies(args), assumed,
                   settings)


def _check_pod(where: str, pod: Mapping[str, Any]) -> None:
    if not isinstance(pod.get("spec"), Mapping) or not unique_images(pod):
        raise InputError(f"{where}: the pod has no container images "
                         "(spec.containers[].image)")


async def _explain(args: argparse.Namespace, inputs: _Inputs) -> dict[str, Any]:
    """Read what is missing from the cluster, inspect the images, run the decision."""
    credentials: list[Any] = list(inputs.settings.credentials) if inputs.settings else []
    placed: list[dict[str, Any]] = []
    policies = inputs.policies
    path = "unknown: no cluster was read"
    if not inputs.cluster:
        assert inputs.pod is not None
        pod = inputs.pod
        if is_stored(pod):
            path = admission_path_taken(pod)
        nodes = load_objects(args.nodes)
        nrt_list = load_objects(args.nrt) if args.nrt else []
        config = _config(args, inputs.config, bool(nrt_list))
    else:
        kubeconfig = inputs.kubeconfig
        async with await connect(kubeconfig, args.context) as api:
            if inputs.pod is None:
                assert inputs.pod_name is not None
                namespace = (args.namespace or _context_namespace(kubeconfig, args.context)
                             or "default")
                pod = await _read_pod(api, namespace, inputs.pod_name)
                _check_pod(args.pod, pod)
                path = admission_path_taken(pod)
            else:
                pod = _namespaced(inputs.pod, args.namespace,
                                  lambda: _context_namespace(kubeconfig, args.context))
                # a file may hold a pod as the API server stored it (kubectl get -o yaml):
                # it went through admission already
                path = (admission_path_taken(pod) if is_stored(pod)
                        else await admission_path_dry_run(api, pod))
            nodes, nrt_list = await read_cluster_objects(api)
            config = _config(args, inputs.config, bool(nrt_list))
            if not config.excluded:
                config = dataclasses.replace(config, excluded=await learned_exclusions(api))
            if policies is None:
                policies = await read_policies(
                    api, str((pod.get("metadata") or {}).get("namespace") or "default"))
            if config.topology.enabled:
                placed = await numa_placed_pods(api)
            if inputs.assumed is None:
                credentials = await cluster_credentials(api, pod, config) + credentials
    if inputs.assumed is not None:
        results: dict[str, Any] = {i: _AssumedImage(i, "", inputs.assumed)
                                   for i in unique_images(pod)}
    else:
        assert inputs.settings is not None
        results = await inspect_images(pod, inputs.settings, credentials,
                                       config.image_inspection.registry_timeout_seconds)
    nrts = _by_name(nrt_list)
    uid = (pod.get("metadata") or {}).get("uid")
    inflight = inflight_from_pods(
        (p for p in placed if (p.get("metadata") or {}).get("uid") != uid), nrts)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    # a policy of a file without a namespace is taken as one of the pod's namespace
    ranked = rank({**o, "metadata": {**(o.get("metadata") or {}), "namespace": namespace}}
                  for o in policies or ()
                  if (o.get("metadata") or {}).get("namespace", namespace) == namespace)
    report = explain(pod, _nodes_only(nodes), nrts, results, config, inflight=inflight,
                     policies=ranked.of(namespace))
    report["path"] = path
    return report


#: What each ``path`` of the decision annotation means.
_PATHS = {
    "admission": "placed at admission by the MutatingAdmissionPolicy podplacement-gate "
                 "(its params object knew every image)",
    "webhook": "placed at admission by the webhook (its cache knew every image for the "
               "pod's pull secrets, or it inspected them within the config's "
               "inspectionBudget)",
    "controller": "gated at admission, placed by the controller's PATCH",
}


def is_stored(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is an object the API server stored (it has a ``metadata.uid`` or
    ``creationTimestamp``), not a manifest still to be created."""
    meta = pod.get("metadata") or {}
    return bool(meta.get("uid") or meta.get("creationTimestamp"))


def admission_path_taken(pod: Mapping[str, Any]) -> str:
    """The path a created pod took, from its ``podplacement.io/decision``
    annotation (``"path"``: ``admission``, ``webhook``; none: the controller) and gate."""
    import json

    from podplacement.rules.config import DECISION_ANNOTATION
    from podplacement.rules.podspec import has_gate

    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(DECISION_ANNOTATION)
    if raw is None:
        return ("gated at admission, waiting for the controller" if has_gate(pod)
                else "none: podplacement did not place this pod")
    try:
        taken = str(json.loads(raw).get("path") or "controller")
    except (ValueError, AttributeError):
        return "unknown: the decision annotation is not JSON"
    return _PATHS.get(taken, taken)


async def admission_path_dry_run(api: KubeAPI, pod: Mapping[str, Any]) -> str:
    """The path a pod not created yet would take: the API server creates it with
    ``dryRun=All`` (the admission policy and the webhook run, nothing is stored), and the
    answer is read with :func:`admission_path_taken`. The rules are the server's own, not a
    copy. Refused (no create right, invalid pod): ``unknown`` with the reason."""
    meta = dict(pod.get("metadata") or {})
    namespace = str(meta.get("namespace") or "default")
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
        meta.pop(key, None)
    # A generated name: a pod of that name may exist (the manifest of a running pod).
    meta["generateName"] = str(meta.pop("name", None) or meta.get("generateName")
                               or "explain") + "-"
    body = {**pod, "metadata": meta, "status": {}}
    try:
        created = await api.request("POST", pod_path(namespace),
                                    params={"dryRun": "All"}, body=body)
    except ApiError as exc:
        return f"unknown: a dry-run create was refused ({exc.status} {exc.reason})"
    taken = admission_path_taken(created)
    return "would be " + taken if not taken.startswith(("unknown", "none")) else taken


async def numa_placed_pods(api: KubeAPI) -> list[dict[str, Any]]:
    """The pods the controller placed toward NUMA candidates (label
    ``podplacement.io/numa=placed``): their requests are still held on those nodes until the
    NRTs show them, so explain holds them too (:func:`rules.place.plan.inflight_from_pods`).
    Not allowed to list pods cluster-wide (403): a warning, and none are held.

    Raises:
        ClusterError: the pods could not be listed otherwise.
    """
    try:
        items, _ = await api.list_all("/api/v1/pods", params={"labelSelector": BINDINGS_SELECTOR})
    except ApiError as exc:
        if exc.status == 403:
            log.warning("cannot list pods cluster-wide (%s): NUMA holds of pods placed "
                        "moments ago are not counted", exc.reason)
            return []
        raise _api_error("listing NUMA-placed pods", exc) from None
    return items


def _nodes_only(objs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind", "Node") == "Node"]


def _namespaced(pod: dict[str, Any], namespace: str | None,
                default: Callable[[], str | None]) -> dict[str, Any]:
    """A file pod in the namespace it would be created in: its own, else ``--namespace``,
    else the context's, else ``default``. Raises InputError when ``--namespace`` differs
    from the pod's own (as kubectl does)."""
    own = (pod.get("metadata") or {}).get("namespace")
    if own:
        if namespace and namespace != own:
            raise InputError(f"the pod's namespace {own!r} does not match --namespace "
                             f"{namespace!r}")
        return pod
    out = copy.deepcopy(pod)
    out.setdefault("metadata", {})["namespace"] = namespace or default() or "default"
    return out


def run(args: argparse.Namespace) -> int:
    """Execute ``podplacement explain``; prints the report to stdout, errors to stderr as one
    line. Returns 0 (report printed), 1 (the cluster could not be read) or 2 (bad input)."""
    try:
        inputs = _inputs(args)
        report = asyncio.run(_explain(args, inputs))
    except (InputError, QuantityError, ValueError) as exc:
        print(f"podplacement explain: {one_line(exc)}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        print(f"podplacement explain: {one_line(exc)}", file=sys.stderr)
        return 1
    sys.stdout.write(render(report, args.output))
    return 0


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand to the ``podplacement`` dispatcher."""
    parser = subparsers.add_parser(
        "explain",
        help="dry-run the placement decision for a pod",
        description="Show where a pod would be placed and why: images and platforms, the "
                    "architecture decision, a verdict and NUMA score per node, and the "
                    "nodeAffinity that would be injected. Nodes and NRTs come from --nodes/"
                    "--nrt files or from a cluster (--kubeconfig, else $KUBECONFIG, "
                    "~/.kube/config or in-cluster, like 'podplacement controller'). With a "
                    "cluster the pod's imagePullSecrets are read from its namespace as the "
                    "controller reads them. Exit code 0 report printed, 1 the cluster could "
                    "not be read, 2 unusable input.",
    )
    parser.add_argument("pod", metavar="POD",
                        help="the pod: a manifest file ('-' for stdin), or pod/NAME to read "
                             "it from the cluster")
    parser.add_argument("--kubeconfig",
                        help="read the pod (pod/NAME), its pull secrets, Nodes and NRTs from "
                             "this cluster (default without --nodes: $KUBECONFIG, "
                             "~/.kube/config or in-cluster)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("-n", "--namespace",
                        help="namespace of the pod (default: the pod's own, else the "
                             "context's, else default)")
    parser.add_argument("--nodes", metavar="NODES.yaml",
                        help="kubectl get nodes -o yaml (instead of a cluster)")
    parser.add_argument("--nrt", metavar="NRTS.yaml",
                        help="kubectl get noderesourcetopologies -o yaml (with --nodes)")
    parser.add_argument("--config", metavar="CONFIG.yaml",
                        help="a PodPlacementConfig (default: the defaults, NUMA placement on "
                             "when any NRT was read)")
    parser.add_argument("--policies", metavar="POLICIES.yaml",
                        help="PodPlacementPolicies of the pod's namespace (default with a "
                             "cluster: those of the pod's namespace in the cluster; without: "
                             "none)")
    parser.add_argument("--assume-platforms", metavar="OS/ARCH,...",
                        help="skip the registry: every image supports these platforms")
    add_registry_arguments(parser)
    parser.add_argument("--scoring-strategy", choices=STRATEGIES,
                        help="override spec.topology.scoringStrategy")
    parser.add_argument("--output", "-o", choices=OUTPUTS, default="table",
                        help="report format: %(choices)s (default: %(default)s)")
    parser.set_defaults(func=run)
