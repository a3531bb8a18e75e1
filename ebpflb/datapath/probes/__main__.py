"""`python -m ebpflb.datapath.probes [--json]`: this kernel's BPF features (the kernel
matrix's guests run it before the tests)."""

import sys

from ebpflb.datapath.probes import main

raise SystemExit(main(sys.argv[1:]))
