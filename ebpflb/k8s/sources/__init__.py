"""Where objects come from: the Kubernetes API server (kubernetes.py, the only module
importing the kubernetes client) or YAML manifests (manifests.py, documents.py), both
feeding the same ObjectSink (base.py)."""
