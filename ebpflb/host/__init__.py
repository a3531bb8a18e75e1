"""The node the agent runs on, outside the datapath: one agent per pin directory
(lock.py), the capabilities it needs (privileges.py), and what kube-proxy left behind
(migrate.py, `ebpflb cleanup --kube-proxy`)."""
