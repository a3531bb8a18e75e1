"""The bench's results as typed, frozen records, and their JSON form.

compare.py, maglev.py and sync.py hold each sub-command's run; agent.py what the agent's
start-up and process cost (shared by compare and sync); codec.py turns any of them into
JSON and back (the one place that knows the JSON shape); legacy.py reads the reports
`ebpflb bench` saved before these records existed (docs/bench/*.json).
"""

from ebpflb.errors import ConfigError


class ReportError(ConfigError):
    """A saved report cannot be read: names the file and the place in it."""
