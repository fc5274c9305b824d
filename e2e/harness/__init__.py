"""Real Kubernetes for tests: etcd + kube-apiserver (+ KCM, scheduler), and a one-node cluster."""
