"""``podplacement demo``: the product run for real on this machine, start to finish.

Steps: find the API server first and say which in the first log line (the real control plane of
:mod:`podplacement.sandbox.controlplane` when its binaries are found: etcd, kube-apiserver,
kube-scheduler and kube-controller-manager; localkube, the API double, as a subprocess when they
are not, with how to get them; or an existing cluster with ``--kubeconfig``), and start it in
the background, with the real amd64 node of :mod:`podplacement.sandbox.realnode` beside the real
control plane when this machine runs one (one line says so, or why not), while the demo gets its
busybox binaries (:mod:`podplacement.demo.images`: downloaded when missing) and starts two real
registries with real multi-arch busybox images (:mod:`podplacement.demo.seed`); apply the CRDs,
nodes, NodeResourceTopologies and the PodPlacementConfig ``cluster``; generate certificates with
``podplacement certs generate``; start ``podplacement webhook`` (HTTPS on 127.0.0.1) and
``podplacement controller`` as processes side by side, exactly as they run in a cluster (the
controller creates the MutatingWebhookConfiguration with the caBundle); create the sample pods
(:mod:`podplacement.demo.workloads`); wait (bounded) until every pod is ungated or waiting for
NUMA resources; print the table (:mod:`podplacement.demo.report`), ``podplacement explain`` of
the pod that waits, and a check of every pod against what its images and the NUMA zones imply;
with a real node, wait (bounded) until the pods bound to it run and print their phase and first
log line, and say which nodes are real and which are simulated; then free CPUs in one NUMA zone
(a NodeResourceTopology update) and show the waiting pod placed there; print a summary of the
controller's ``/metrics``; stop everything it started (processes terminated and waited for, the
real node's host effects undone, the work directory removed), also on Ctrl-C and errors. The
output and the last log line end with the real nodes that ran (``real nodes: amd64, arm64``,
the emulated arm64 node of ``start_real_node(arch="arm64")`` beside the amd64 one when this
machine runs it: the pods placed arm64-only run there).
Exit code: 0 when everything went as expected, 1 when a pod did not, 2 when a step failed,
130 when interrupted.

With ``--kubeconfig`` nothing is faked: no nodes, NRTs, config, webhook or controller are
created (the product must already be installed, ``kubectl apply -k deploy/`` and its config
created, ``kubectl create -f deploy/samples/podplacementconfig.yaml``); only the
namespace, the pull secret and the pods are, and the namespace is deleted at the end. The
registries still listen on 127.0.0.1 of this machine, so the cluster's controller can reach
them only when it runs here too: that is the limitation of that mode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import tempfile
import time
from pathlib import Path

from podplacement.demo import workloads
from podplacement.demo.cluster import (
    ApiServer,
    choose_api_server,
    start_localkube,
    start_real_cluster,
)
from podplacement.demo.common import Child, DemoError, DemoOptions, api_ok, start_child, wait_for
from podplacement.demo.images import DemoImageError, prepare_busybox
from podplacement.demo.install import (
    controller_args,
    generate_certs,
    install_cluster_objects,
    install_crds,
    install_namespace,
    start_webhook,
    wait_webhook_ready,
    wait_webhook_registered,
)
from podplacement.demo.pods import explain_pod, run_workloads
from podplacement.demo.seed import DemoRegistryPair, push_images, start_registries
from podplacement.demo.teardown import (
    cleanup,
    log_tails,
    signals_ignored,
    started_anyway,
    terminate_as_interrupt,
)
from podplacement.kubeclient import ApiError, KubeAPI
from podplacement.rules.config import API_VERSION, CONFIG_NAME, CONFIG_PLURAL

log = logging.getLogger("podplacement.demo")


async def scenario(options: DemoOptions, pair: DemoRegistryPair, server: ApiServer, work: Path,
                   children: list[Child]) -> int:
    """Everything after the registries and the API server are up; processes it starts are
    appended to ``children`` at once, so the caller stops them whatever happens."""
    log_dir = work / "logs"
    registries = pair.names
    api = await KubeAPI.from_kubeconfig(str(server.kubeconfig))
    try:
        await wait_for("the API server", lambda: api_ok(api, "/version"), 30.0,
                       alive=[server.child] if server.child else [])
        if server.kind == "existing":
            if not await api_ok(api, f"/apis/{API_VERSION}/{CONFIG_PLURAL}/{CONFIG_NAME}"):
                raise DemoError(
                    "the cluster has no PodPlacementConfig 'cluster': install podplacement "
                    "first (kubectl apply -k deploy/; kubectl create -f "
                    "deploy/samples/podplacementconfig.yaml)"
                )
            await install_namespace(api, registries)
            return await run_workloads(api, registries, server, options, [])

        await install_crds(api)
        config = workloads.placement_config(max_wait_seconds=options.max_wait_seconds)
        await install_cluster_objects(api, config, real_node=server.node is not None,
                                      real_arm64=server.arm64_node is not None)
        await install_namespace(api, registries)
        log.info("cluster objects applied (%d nodes, %d NodeResourceTopologies, config %s)",
                 len(workloads.NODES), len(workloads.nrt_objects()), CONFIG_NAME)

        cert_dir, ca_pem = await generate_certs(work)
        # side by side: the controller registers the webhook while it starts; no pod is
        # created before both are ready
        webhook, webhook_port = start_webhook(cert_dir, server.kubeconfig, log_dir)
        children.append(webhook)
        args, env, metrics_url = controller_args(work, pair, server.kubeconfig, cert_dir,
                                                 webhook_port)
        controller = start_child("controller", args, log_dir, env)
        children.append(controller)
        watch = [webhook, controller] + ([server.child] if server.child else [])
        await wait_webhook_ready(webhook, webhook_port, ca_pem, watch)
        await wait_webhook_registered(api, watch)
        log.info("webhook registered by the controller; creating the workloads")
        explain = functools.partial(explain_pod, work, pair, server.kubeconfig, config)
        return await run_workloads(api, registries, server, options, watch, metrics_url,
                                   explain)
    finally:
        await api.close()


def run_demo(options: DemoOptions) -> int:
    """Run the whole demo; returns the exit code (0: every workload as expected, 1: some
    not, 2: a step failed, 130: interrupted). Everything started is stopped before return.
    """
    started = time.monotonic()
    # the registry pushes would log every HTTP request
    logging.getLogger("httpx").setLevel(logging.WARNING)
    children: list[Child] = []
    pair: DemoRegistryPair | None = None
    server: ApiServer | None = None
    starting: concurrent.futures.Future[ApiServer] | None = None
    work: Path | None = None
    code = 2
    with terminate_as_interrupt():
        try:
            assets = choose_api_server(options)
            work = Path(tempfile.mkdtemp(prefix="podplacement-demo-"))
            log.info("work directory %s", work)
            if options.kubeconfig is None:
                # the API server starts while the images are built and pushed
                pool = concurrent.futures.ThreadPoolExecutor(1, "api-server")
                starting = pool.submit(
                    start_real_cluster if assets is not None else start_localkube, work,
                    *((assets, options.debs) if assets is not None else (work / "logs",)))
                pool.shutdown(wait=False)
            busybox = prepare_busybox(options.debs, download=options.download)
            log.info("busybox binaries: %s", ", ".join(
                f"{arch} ({b.binary_size} bytes, {b.source})" for arch, b in busybox.items()))
            pair = start_registries(work)
            digests = push_images(pair, busybox)
            log.info("registries: public http://%s, private https://%s (basic auth); "
                     "%d tags pushed", pair.public.host, pair.private.host, len(digests))
            if starting is None:
                server = ApiServer(options.kubeconfig or Path(), "existing", scheduler=True,
                                   node_note="an existing cluster: its own nodes")
            else:
                server = starting.result()
                starting = None
            for real in server.real_nodes:
                for registry in (pair.public, pair.private):
                    real.trust_registry(registry)
            code = asyncio.run(scenario(options, pair, server, work, children))
        except KeyboardInterrupt:
            log.warning("interrupted; stopping everything")
            code = 130
        except (DemoError, DemoImageError, ApiError) as exc:
            log.error("demo failed: %s", exc)
            log_tails(children, server)
            code = 2
        except Exception as exc:
            log.exception("demo failed: %s", exc)
            log_tails(children, server)
            code = 2
        finally:
            with signals_ignored():
                if starting is not None:  # interrupted or failed while it started
                    server = started_anyway(starting)
                if work is not None:
                    cleanup(options, work, children, server, pair)
    log.info("demo finished in %.1f s (exit code %d); %s", time.monotonic() - started, code,
             server.real_nodes_line() if server is not None else "real nodes: none")
    return code


__all__ = ["DemoError", "DemoOptions", "run_demo"]
