"""The per-packet ClusterIP path's decisions (bpf/lib/nodeport.h built with EBPFLB_POD_PATH,
on a pod's interface): NodePort's steps, with the three choices that build turns: the
frontend as an in-node client sees it, no endpoint always answered, SNAT only for a pod that
lands on itself (hairpin)."""

from __future__ import annotations

from collections.abc import Sequence

from ebpflb.explain.engine import (
    StepFn,
    Work,
    candidate_address,
    conntrack,
    lookup_frontend_in_node,
    node_address,
    outside_select,
    reply_of_snat,
    table,
)
from ebpflb.explain.engine import affinity as client_affinity
from ebpflb.explain.model import Explanation, Nat, Verdict


def pod_nat(work: Work) -> Explanation | None:
    """np_snat() for pods: the client's address is kept unless the backend is the client."""
    chosen = work.backend
    if chosen is None:
        work.nat = Nat(False, "no SNAT unless the backend chosen is the client itself (hairpin)")
    elif candidate_address(chosen) != work.query.client:
        work.nat = Nat(False, "another pod or node: DNAT only, the client's address is kept")
    else:
        address = node_address(work, work.query.client)
        if address is None:
            work.note("nat", "hairpin, and no node address to SNAT to")
            return work.done(Verdict.DROPPED, "SNAT needed, no node address: dropped")
        work.nat = Nat(
            True,
            "hairpin: the pod reaches itself through its Service, so its source becomes a"
            " node address (kube-proxy's masquerade), or it would answer itself",
            str(address),
        )
    work.note("nat", work.nat.reason)
    target = chosen.backend if chosen is not None else "one of the candidates"
    return work.done(Verdict.TRANSLATED, f"DNAT to {target}" + (", SNAT" if work.nat.snat else ""))


POD_STEPS: Sequence[StepFn] = (
    reply_of_snat,
    lookup_frontend_in_node,
    conntrack,
    table,
    client_affinity,
    outside_select,
    pod_nat,
)
