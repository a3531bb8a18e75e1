"""ebpflb: an eBPF (BCC) Kubernetes service load balancer replacing kube-proxy's iptables mode."""

__version__ = "0.2.0"
