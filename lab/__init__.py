"""The lab: what measures and tests ebpflb, never the agent itself (its own distribution,
lab/pyproject.toml; the agent's wheel and image do not carry it).

- bench/: `ebpflb bench` (compare, maglev, sync, bulk), measured into typed records;
- harness/: what tests and the bench build on: network namespaces, cgroups, echo servers,
  the fake API server, agent processes, the machine-wide lock;
- kernels/: the kernel tests on Debian's kernels under qemu (`make test-kernels`);
- demo.py: `make demo`.
"""
