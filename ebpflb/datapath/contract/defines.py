"""The -D flags that carry the configured sizes into the C code (consts.h keeps only
``#ifndef`` defaults), so that a size exists once, as a Config field: ``cflags(config)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ebpflb.config import Config

# ---- sizes passed as -D flags (consts.h #ifndef defaults) --------------------------------


@dataclass(frozen=True, slots=True)
class Define:
    """One -D flag: a consts.h macro and the configuration value that sets it."""

    macro: str
    value: Callable[[Config], int | str]
    literal: str = "{}"  # how the value is spelled in C

    def flag(self, config: Config) -> str:
        return f"-D{self.macro}={self.literal.format(self.value(config))}"


PIN_DIR = Define("EBPFLB_PIN_DIR", lambda c: str(c.bpffs_dir), '"{}"')
MAX_SERVICES = Define("EBPFLB_MAX_SERVICES", lambda c: c.max_services)
MAX_BACKENDS = Define("EBPFLB_MAX_BACKENDS", lambda c: c.max_backends)
SLOT_POOL_SIZE = Define("EBPFLB_SLOT_POOL_SIZE", lambda c: c.slot_pool_size)
REV_SK_MAX = Define("EBPFLB_REV_SK_MAX", lambda c: c.rev_sk_max)
CT_MAX = Define("EBPFLB_CT_MAX", lambda c: c.ct_max)
RNAT_MAX = Define("EBPFLB_RNAT_MAX", lambda c: c.rnat_max)
SRC_RANGE_MAX = Define("EBPFLB_SRC_RANGE_MAX", lambda c: c.src_range_max)
AFFINITY_MAX = Define("EBPFLB_AFFINITY_MAX", lambda c: c.affinity_max)

DEFINES: tuple[Define, ...] = (
    PIN_DIR,
    MAX_SERVICES,
    MAX_BACKENDS,
    SLOT_POOL_SIZE,
    REV_SK_MAX,
    CT_MAX,
    RNAT_MAX,
    SRC_RANGE_MAX,
    AFFINITY_MAX,
    Define("EBPFLB_SNAT_PORT_MIN", lambda c: c.snat_port_min),
    Define("EBPFLB_SNAT_PORT_MAX", lambda c: c.snat_port_max),
    Define("EBPFLB_FLOW_HASH_SEED", lambda c: c.flow_hash_seed, "{}U"),
    Define("EBPFLB_CT_TCP_TIMEOUT", lambda c: c.ct_tcp_timeout),
    Define("EBPFLB_CT_TCP_SYN_TIMEOUT", lambda c: c.ct_tcp_syn_timeout),
    Define("EBPFLB_CT_TCP_CLOSE_TIMEOUT", lambda c: c.ct_tcp_close_timeout),
    Define("EBPFLB_CT_TCP_CLOSE_WAIT_TIMEOUT", lambda c: c.ct_tcp_close_wait_timeout),
    Define("EBPFLB_CT_UDP_TIMEOUT", lambda c: c.ct_udp_timeout),
)
# Set from the kernel feature probe (loader.Features), not from the configuration.
HAVE_SET_RETVAL = "EBPFLB_HAVE_SET_RETVAL"
HAVE_SK_STORAGE = "EBPFLB_HAVE_SK_STORAGE"
FEATURE_MACROS = (HAVE_SET_RETVAL, HAVE_SK_STORAGE)
# Set per program variant: bpf/nodeport.c built for pods' interfaces (podlb.PodLB); the
# agent's network namespace cookie for --socket-lb=hostns-only (loader.SocketLB).
POD_PATH = "EBPFLB_POD_PATH"
SOCK_NETNS_COOKIE = "EBPFLB_SOCK_NETNS_COOKIE"
VARIANT_MACROS = (POD_PATH, SOCK_NETNS_COOKIE)


def cflags(config: Config) -> list[str]:
    """The -D flags that size the maps and place the pins."""
    return [define.flag(config) for define in DEFINES]
