"""The loop: the agent (agent.py) takes the sources' changes into the trackers, computes
the desired state and hands it to the reconciler, driven by the bounded-frequency runner
(runner.py); healthcheck.py serves the healthCheckNodePorts of the services it programs."""
