"""The clients' session-affinity entries (ebpflb_aff4) as explain reads them.

The MapSet does not carry ebpflb_aff4: only the datapath writes it (the control plane
never does), and only explain reads it. So explain opens the pin itself, through the
datapath's pinned-map classes and the contract's struct, with byte order from
datapath/maps/layout.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ebpflb.datapath import contract
from ebpflb.datapath.contract import AffClient, MapName
from ebpflb.datapath.maps import layout
from ebpflb.explain.flowhash import addr6_fold
from ebpflb.model import IPAddress

if TYPE_CHECKING:
    from ebpflb.datapath.maps.kernel import KernelMap
    from ebpflb.datapath.maps.pinned import PinnedMap


@dataclass(frozen=True, slots=True, order=True)
class Folded6:
    """An IPv6 source as tc/XDP keys its affinity (hash.h's addr6_fold): 64 bits, not the
    address (many addresses fold to one, so a dumped key cannot name its client)."""

    value: int

    @classmethod
    def of(cls, address: IPv6Address) -> Folded6:
        return cls(addr6_fold(address))

    def __str__(self) -> str:
        return f"IPv6 source folded to {self.value:#018x}"


@dataclass(frozen=True, slots=True, order=True)
class AffinityKey:
    """struct aff_key: one client of one frontend. Socket-LB knows a client by its network
    namespace (bpf_get_netns_cookie), tc/XDP by its source address: an IPv4 one as it is,
    an IPv6 one folded (`Folded6`). Build one for an address with `for_source`."""

    client: int | IPv4Address | Folded6  # a netns cookie (int) or a source address
    svc_id: int

    @classmethod
    def for_source(cls, source: IPAddress, svc_id: int) -> AffinityKey:
        """The key tc/XDP looks up for a packet from `source`."""
        if isinstance(source, IPv6Address):
            return cls(Folded6.of(source), svc_id)
        return cls(source, svc_id)

    @property
    def kind(self) -> AffClient:
        """aff_key.netns: what `client` is."""
        if isinstance(self.client, IPv4Address):
            return AffClient.ADDR4
        return AffClient.ADDR6 if isinstance(self.client, Folded6) else AffClient.NETNS

    @property
    def netns(self) -> bool:
        return self.kind is AffClient.NETNS

    def __str__(self) -> str:
        return f"netns cookie {self.client}" if self.netns else str(self.client)


@dataclass(frozen=True, slots=True)
class AffinityEntry:
    """struct aff_val: the backend a client was last sent to, and when."""

    last_used_ns: int  # bpf_ktime_get_ns() (CLOCK_MONOTONIC) of its last new connection
    backend_id: int


class AffinityTable(Protocol):
    def get(self, key: AffinityKey) -> AffinityEntry | None: ...

    def items(self) -> Iterator[tuple[AffinityKey, AffinityEntry]]: ...


def encode_key(key: AffinityKey) -> contract.AffKey:
    raw = contract.AffKey()
    if isinstance(key.client, IPv4Address):
        # The C code stores the packet's __be32 source zero-extended into the u64.
        raw.client = layout.addr_to_be32(key.client)
    elif isinstance(key.client, Folded6):
        raw.client = key.client.value
    else:
        raw.client = key.client
    raw.svc_id, raw.netns = key.svc_id, int(key.kind)
    return raw


def decode_key(raw: contract.AffKey) -> AffinityKey:
    """ValueError for a kind no program writes (a newer layout, or garbage)."""
    kind, svc_id = AffClient(int(raw.netns)), int(raw.svc_id)
    if kind is AffClient.NETNS:
        return AffinityKey(int(raw.client), svc_id)
    if kind is AffClient.ADDR6:
        return AffinityKey(Folded6(int(raw.client)), svc_id)
    return AffinityKey(layout.be32_to_addr(int(raw.client) & 0xFFFFFFFF), svc_id)


def encode_value(entry: AffinityEntry) -> contract.AffVal:
    return contract.AffVal(entry.last_used_ns, entry.backend_id, 0)


def decode_value(raw: contract.AffVal) -> AffinityEntry:
    return AffinityEntry(int(raw.last_used), int(raw.backend_id))


class PinnedAffinity:
    """ebpflb_aff4 under a bpffs directory (AffinityTable), opened read-only by use."""

    def __init__(self, bpffs_dir: Path) -> None:
        # Imported here: the datapath's kernel module loads libbcc, which unit tests of
        # explain (against the fake map set) do not need.
        from ebpflb.datapath.maps.codecs import Codec
        from ebpflb.datapath.maps.kernel import KernelMap
        from ebpflb.datapath.maps.pinned import PinnedMap

        spec = contract.MAPS[MapName.AFFINITY]
        self._pinned: PinnedMap = PinnedMap(bpffs_dir / MapName.AFFINITY.value)
        try:
            self._pinned.check(spec)
        except Exception:
            self._pinned.close()
            raise
        self._map: KernelMap[AffinityKey, AffinityEntry] = KernelMap(
            self._pinned,
            Codec(contract.AffKey, encode_key, decode_key),
            Codec(contract.AffVal, encode_value, decode_value),
        )

    def get(self, key: AffinityKey) -> AffinityEntry | None:
        return self._map.get(key)

    def items(self) -> Iterator[tuple[AffinityKey, AffinityEntry]]:
        return self._map.items()

    def close(self) -> None:
        self._pinned.close()

    def __enter__(self) -> PinnedAffinity:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
