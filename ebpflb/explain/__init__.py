"""`ebpflb explain`: what the datapath does with one connection or packet, computed from
the pinned maps by mirroring the C programs' decisions step by step (read-only: it works
with the agent down).

model.py holds the result types, engine.py the steps (one function per decision the C
code takes, in its order; pod.py the per-packet path's), walk.py the walk through a path's
steps, flowhash.py the hash mirrors, render.py the text form.
"""

from ebpflb.explain.model import Explanation, Path, Query, Verdict
from ebpflb.explain.walk import explain

__all__ = ["Explanation", "Path", "Query", "Verdict", "explain"]
