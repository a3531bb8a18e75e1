"""`ebpflb bench compare|maglev|sync`: each measures into a typed record and prints it.

- command.py: the sub-commands' options and dispatch (`ebpflb bench`'s arguments);
  settings.py: what each measures and --quick; scenario.py: the services and addresses.
- records/: the results as frozen dataclasses and their JSON (codec.py, legacy.py);
  targets.py: compare's targets and verdicts; render.py: every report as text;
  plot.py: compare's figure (render and plot need the `bench` extra, extras.py).
- Measuring: measure/ (traffic.py: latency batches and rates; cost.py: loader time,
  process CPU and memory, kernel memory; changes.py: API write -> map entry;
  machine.py), loadgen.py + connbench.c (the compiled client), agent.py (the agent's
  /readyz, /status and /metrics).
- Orchestration: compare.py (N x modes, phases), modes.py (programming each mode),
  kubeproxy/ (kube-proxy's rulesets), topology.py (the namespaces), agentrun.py (the
  real agent, started and removed); sync.py and maglev.py run their benchmarks.
"""
