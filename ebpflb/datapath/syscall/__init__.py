"""The kernel interfaces the datapath uses without BCC: bpf(2) through ctypes (bpfsys.py)
with its ABI values defined once (uapi.py), sock_diag (sockdiag.py) and where bpffs and
cgroup2 are mounted (mounts.py)."""
