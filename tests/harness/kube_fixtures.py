"""pytest fixtures for the Kubernetes API: localkube, or a real control plane
(etcd + kube-apiserver from KUBEBUILDER_ASSETS)."""
