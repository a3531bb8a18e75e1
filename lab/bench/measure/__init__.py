"""What the bench measures, apart from how a run is set up: traffic.py (latency batches,
rates), cost.py (loader time, process CPU and memory, kernel memory), changes.py (API write
-> map entry), machine.py (the machine's facts, waiting for it to go quiet)."""
