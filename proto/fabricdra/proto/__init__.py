"""kubelet's gRPC contracts (plugin registration, DRA node API, DRA health), compiled."""
