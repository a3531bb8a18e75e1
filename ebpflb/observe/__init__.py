"""Observing the agent from outside: its health (kube-proxy's /healthz and /livez, and
/readyz), its status record (/status), its Prometheus metrics (metrics.py, kube-proxy's
in kubeproxy_metrics.py and proxysync.py; map fill levels, fill.py; per-service counters,
svccounters.py), the HTTP servers that expose them (http.py), and `ebpflb status`'s view
of them (statusview.py)."""
