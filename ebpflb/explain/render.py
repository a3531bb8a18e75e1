"""An Explanation as text: the verdict first, then each decision in the datapath's order,
the backends the table may pick, the NAT and the frontend's counters."""

from __future__ import annotations

from ebpflb.explain.model import Explanation, Path

PATHS = {
    Path.SOCKET: "connect()/sendmsg() on this node (socket-LB)",
    Path.OUTSIDE: "a packet arriving on a node interface (tc/XDP)",
    Path.POD: "a packet a pod sends, on its interface (the per-packet path, --pod-interfaces)",
}


def render_text(ex: Explanation) -> str:
    q = ex.query
    where = PATHS[q.path] + (f", on {q.ingress}" if q.ingress else "")
    lines = [f"{q}: {where}", f"verdict: {ex.verdict.value}: {ex.reason}"]
    width = max((len(s.name) for s in ex.steps), default=0)
    for number, step in enumerate(ex.steps, 1):
        lines.append(f"  {number}. {step.name:<{width}}  {step.outcome}")
    if ex.backend is not None:
        how = " (session affinity)" if ex.selection and ex.selection.from_affinity else ""
        lines.append(f"backend: {ex.backend.backend}{_where(ex.backend.local)}{how}")
    if ex.nat is not None:
        nat = "SNAT" if ex.nat.snat else "no SNAT"
        if ex.nat.snat and ex.nat.source:
            nat += f" to {ex.nat.source}"
            if ex.nat.first_port is not None:
                nat += f" (first port tried {ex.nat.first_port})"
        noted = any(step.outcome == ex.nat.reason for step in ex.steps)
        lines.append(f"nat: {nat}" + ("" if noted else f": {ex.nat.reason}"))
    if ex.selection is not None and not ex.selection.deterministic:
        lines.append("the choice is not reproducible from the 5-tuple; possible backends:")
    elif ex.candidates:
        lines.append("backends of the table:")
    if ex.candidates and ex.frontend is not None:
        size = ex.frontend.table_size
        for c in ex.candidates:
            mark = " <=" if ex.backend is not None and c.backend_id == ex.backend.backend_id else ""
            lines.append(
                f"  {c.backend:<21} {c.slots:>6}/{size} slots {c.share:>7.2%}"
                f"{_where(c.local)}{' terminating' if c.terminating else ''}{mark}"
            )
    if ex.affinity is not None:
        a = ex.affinity
        timeout = f", timeout {a.timeout_s} s" if a.timeout_s is not None else ""
        client = f" {a.client}" if a.client is not None else ""
        lines.append(f"affinity: by {a.keyed_by}{client}{timeout}: {a.outcome}")
        for e in a.entries:
            state = "followed" if e.followed else ("expired" if not e.fresh else "ignored")
            if not e.matched:
                state = "ignored (not the frontend's)"
            lines.append(f"  {e.client:<24} -> {e.backend:<21} {e.age_s:>8.0f} s ago  {state}")
    if ex.counters is not None:
        n = ex.counters
        lines.append(
            f"counters: socket translations {n.sock_xlated}, refused {n.refused}, NodePort"
            f" flows {n.np_flows}, packets {n.np_packets}, bytes {n.np_bytes}"
        )
    return "\n".join(lines)


def _where(local: bool) -> str:
    return " (this node)" if local else " (another node)"
