"""Observing the agent from outside: its health (kube-proxy's /healthz and /livez, and
/readyz), its status record (/status) and the HTTP servers that expose them with /metrics."""
