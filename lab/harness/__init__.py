"""The test harness: network namespaces and cgroups (netns.py, cluster.py), echo and load
clients (echo.py, connload.py, bulk.py), the fake API server (fakeapi.py), the agent as a
process (agentproc.py, nshttp.py), leftovers of crashed runs (leftovers.py) and the
machine-wide lock kernel sessions take (machinelock.py)."""
