"""The C datapath keeps its families in step: every IPv4 helper in bpf/ has its IPv6 twin
(the same name with the family's 4 turned into 6), or a reason here why it has none. A new
IPv4 helper without a twin fails this test until it gets one or a stated reason."""

from __future__ import annotations

import re

from tests import REPO

BPF = REPO / "bpf"
FUNCTION = re.compile(r"^static (?:__always_inline|EBPFLB_NOINLINE) [^(;]*?\b(\w+)\(", re.MULTILINE)
# A name's IPv4 mark: a word part of letters then a 4 (pkt4, fib4, forward4, update4...).
FAMILY_PART = re.compile(r"^([a-z]+)4$")
# Word parts ending in 4 that are not the family: layer 4, a 4-byte checksum word, the
# IPv4-mapped form of an IPv6 address (ipv6_is_v4_mapped).
NOT_FAMILY = frozenset({"l4", "replace4", "v4"})

NO_TWIN = {
    "tc_dec_ttl": "IPv6's router duty is tc_dec_hop_limit: the hop limit has no header checksum",
    "tc_reject4_tcp": "tc_reject6 answers TCP and UDP alike with ICMPv6 port unreachable"
    " (ip6tables' default REJECT); IPv4 answers TCP with a RST as iptables' REJECT does",
    "tc_reject4_udp": "see tc_reject4_tcp: one IPv6 answer for both protocols",
    "tc_may_fragment4": "IPv6 routers never fragment: too big is always packet too big",
    "tc_fragment4": "see tc_may_fragment4",
    "tc_fragmented4_out": "see tc_may_fragment4",
}


def functions() -> set[str]:
    found: set[str] = set()
    for path in [*BPF.glob("*.c"), *BPF.glob("lib/*.h")]:
        found.update(FUNCTION.findall(path.read_text()))
    return found


def twin(name: str) -> str | None:
    """The IPv6 name of an IPv4 helper; None for a name without a family mark."""
    parts = name.split("_")
    marked = [i for i, p in enumerate(parts) if FAMILY_PART.match(p) and p not in NOT_FAMILY]
    if not marked:
        return None
    for i in marked:
        parts[i] = parts[i][:-1] + "6"
    return "_".join(parts)


def test_the_name_rule() -> None:
    assert twin("pkt4_parse") == "pkt6_parse"
    assert twin("tc_forward4") == "tc_forward6"
    assert twin("l4_csum_update4") == "l4_csum_update6"
    assert twin("pkt4_l4_csum_off") == "pkt6_l4_csum_off"
    assert twin("csum_replace4") is None
    assert twin("lb_select_backend") is None


def test_every_ipv4_helper_has_its_ipv6_twin() -> None:
    names = functions()
    assert len(names) > 50, "no C helpers found: has bpf/ moved?"
    missing = sorted(
        f"{name} -> {twin(name)}"
        for name in names
        if twin(name) is not None and twin(name) not in names and name not in NO_TWIN
    )
    assert not missing, "IPv4 helpers without an IPv6 twin (add it, or a reason to NO_TWIN):\n" + (
        "\n".join(missing)
    )


def test_every_stated_reason_still_applies() -> None:
    names = functions()
    stale = sorted(n for n in NO_TWIN if n not in names or twin(n) in names)
    assert not stale, f"NO_TWIN names helpers that are gone or have a twin now: {stale}"
