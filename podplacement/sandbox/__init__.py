"""Launchers of real local components shared by ``podplacement demo`` and the tests.

- :mod:`podplacement.sandbox.controlplane`: the real Kubernetes control plane of the envtest
  convention (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) on 127.0.0.1,
  found without setup (``KUBEBUILDER_ASSETS``, else ``../shared/k8s-bin`` plus Debian's etcd),
  and fake Ready nodes for it.
"""
