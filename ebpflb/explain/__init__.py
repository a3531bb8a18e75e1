"""`ebpflb explain`: what the datapath does with one connection or packet, computed from
the pinned maps by mirroring the C programs' decisions step by step (read-only: it works
with the agent down).

model.py holds the result types, engine.py the steps (one function per decision the C
code takes, in its order), flowhash.py the hash mirrors, render.py the text form.
"""

from ebpflb.explain.engine import explain
from ebpflb.explain.model import Explanation, Path, Query, Verdict

__all__ = ["Explanation", "Path", "Query", "Verdict", "explain"]
