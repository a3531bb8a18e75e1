"""The datapath adapter: the only package that talks to the kernel's BPF subsystem (BCC
to compile, bpf(2) for everything else). contract/ is what C and Python agree on;
maps/ the pinned maps behind typed Protocols; programs/ compiling, loading and
attaching the programs; probes/ what this kernel offers; syscall/ bpf(2), its ABI
values and sock_diag; addrwatch.py the node's addresses as they change."""
