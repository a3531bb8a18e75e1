"""The BPF programs: compiled by BCC in a child process (compiler.py), stored as bytecode
(progcache.py), loaded or adopted as a set (programset.py), attached to the cgroup and
the interfaces (loader.py, netdev.py), and run on one packet for tests (testrun.py)."""
