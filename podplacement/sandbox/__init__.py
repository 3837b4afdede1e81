"""Launchers of real local components shared by ``podplacement demo`` and the tests.

- :mod:`podplacement.sandbox.controlplane`: the real Kubernetes control plane of the envtest
  convention (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) on 127.0.0.1,
  found without setup (``KUBEBUILDER_ASSETS``, else ``../shared/k8s-bin`` plus Debian's etcd),
  and fake Ready nodes for it.
- :mod:`podplacement.sandbox.realnode`: one real amd64 node for it (kubelet v1.36.2,
  containerd, runc; our CNI plugin and pause image from :mod:`podplacement.sandbox.nodeparts`)
  whose host effects :mod:`podplacement.sandbox.hostfx` records and undoes; with
  ``arch="arm64"`` the emulated arm64 node (docs/arm64-node.md): Debian's packages
  extracted by :mod:`podplacement.sandbox.emulated`, a user namespace with its own
  ``binfmt_misc`` (:mod:`podplacement.sandbox.binfmtns`), the exec guard refusing x86
  programs (:mod:`podplacement.sandbox.execguard`) and the CRI relay
  (:mod:`podplacement.sandbox.criproxy`).
- :mod:`podplacement.sandbox.registry`: a real OCI registry (Debian's ``docker-registry``) on
  127.0.0.1, plain HTTP, TLS, htpasswd basic auth or bearer-token auth.
- :mod:`podplacement.sandbox.oci`: pushing images, indexes and attestations to it over the OCI
  distribution API.
"""
