/* Map definitions only. Hash maps the control plane writes are BPF_F_NO_PREALLOC: memory
 * follows the entries (plus 16 bytes a bucket), not max_entries; so is ebpflb_rnat4, written
 * once per new NodePort flow (a failed insert is counted, STAT_RNAT_STORE_FAIL). LRU maps
 * cannot be: the kernel preallocates their lists. All are pinned under EBPFLB_PIN_DIR: BCC opens an existing pin or
 * creates and pins the map, so maps (and the traffic they steer) outlive the agent. The
 * agent checks a pin's type, sizes and flags before compiling (ebpflb/datapath/programs/loader.py)
 * against ebpflb/datapath/contract/ MAPS, which tests/unit/datapath/test_contract.py compares with
 * this file. */
#ifndef EBPFLB_MAPS_H
#define EBPFLB_MAPS_H

#include "structs.h"

/* Frontend -> service: table location, flags. The first lookup of every translation. */
BPF_TABLE_PINNED("hash", struct lb4_svc_key, struct lb_svc_val, ebpflb_svc4,
		 EBPFLB_MAX_SERVICES, EBPFLB_PIN_DIR "/ebpflb_svc4", BPF_F_NO_PREALLOC);

/* Backend id -> address; shared by every service that uses the backend. An array indexed by
 * id (1..EBPFLB_MAX_BACKENDS; 0 is never allocated): one lookup with no hashing, where a
 * hash cost a second cache miss per connect() to a cold service. An array cannot delete:
 * a removed backend is an all-zero element, which the programs treat as absent
 * (lb_backend_lookup). */
BPF_TABLE_PINNED("array", __u32, struct lb4_backend, ebpflb_be4,
		 EBPFLB_MAX_BACKENDS + 1, EBPFLB_PIN_DIR "/ebpflb_be4");

/* IPv6 frontend -> service (struct lb_svc_val: same ids, slot pool and flags as IPv4). */
BPF_TABLE_PINNED("hash", struct lb6_svc_key, struct lb_svc_val, ebpflb_svc6,
		 EBPFLB_MAX_SERVICES, EBPFLB_PIN_DIR "/ebpflb_svc6", BPF_F_NO_PREALLOC);

/* Backend id -> IPv6 address: ebpflb_be4's twin for the ids of IPv6 backends (one id
 * space, so both arrays have EBPFLB_MAX_BACKENDS + 1 elements; an id's element in the
 * other family's array stays all zero). */
BPF_TABLE_PINNED("array", __u32, struct lb6_backend, ebpflb_be6,
		 EBPFLB_MAX_BACKENDS + 1, EBPFLB_PIN_DIR "/ebpflb_be6");

/* Maglev slot pool: slot pair -> backend ids; each frontend owns a contiguous range. The
 * pool itself (ebpflb_slots: an array of EBPFLB_SLOT_POOL_SIZE / 2 pairs at most, flags
 * BPF_F_MMAPABLE | BPF_F_INNER_MAP, so the agent writes tables as memory) starts small and
 * grows: the agent swaps a larger copy into this one-slot map (ebpflb/datapath/maps/growable.py,
 * which creates both pins before the programs are compiled). */
BPF_TABLE_PINNED("array_of_maps$ebpflb_slots", __u32, __u32, ebpflb_slotref,
		 1, EBPFLB_PIN_DIR "/ebpflb_slotref");

/* Service id -> "namespace/name:port", for dumps and agent restarts only. */
BPF_TABLE_PINNED("hash", __u32, struct lb_svc_meta, ebpflb_svcmeta,
		 EBPFLB_MAX_SERVICES, EBPFLB_PIN_DIR "/ebpflb_svcmeta", BPF_F_NO_PREALLOC);

/* (socket cookie, backend) -> frontend, for recvmsg4/getpeername4: every socket's entry
 * without EBPFLB_HAVE_SK_STORAGE, else those of UDP sockets only (see ebpflb_sockrev4). */
BPF_TABLE_PINNED("lru_hash", struct lb4_revsk_key, struct lb4_revsk_val, ebpflb_revsk4,
		 EBPFLB_REV_SK_MAX, EBPFLB_PIN_DIR "/ebpflb_revsk4");

/* (socket cookie, IPv6 backend) -> frontend, for recvmsg6/getpeername6: ebpflb_revsk4's
 * twin (UDP sockets, and TCP ones without EBPFLB_HAVE_SK_STORAGE). A quarter of its size:
 * an LRU map is preallocated, and at full size this one would cost 30 MiB (7.5 MiB so). */
BPF_TABLE_PINNED("lru_hash", struct lb6_revsk_key, struct lb6_revsk_val, ebpflb_revsk6,
		 EBPFLB_REV_SK_MAX / 4 + 1, EBPFLB_PIN_DIR "/ebpflb_revsk6");

/* Socket storage: a connected TCP socket's backend and the frontend it stands for, stored
 * in the socket itself, so the entry costs no hash insert at connect() and lives exactly as
 * long as the socket. Used with EBPFLB_HAVE_SK_STORAGE (bpf_sk_storage_get in sock_addr
 * programs, probed); declared always (the map type is older than the 5.8 the hooks need),
 * so the pins are the same either way. */
BPF_TABLE_PINNED("sk_storage", int, struct lb4_sock_rev, ebpflb_sockrev4, 0,
		 EBPFLB_PIN_DIR "/ebpflb_sockrev4", BPF_F_NO_PREALLOC);

/* ebpflb_sockrev4's twin for TCP sockets connected to an IPv6 frontend. */
BPF_TABLE_PINNED("sk_storage", int, struct lb6_sock_rev, ebpflb_sockrev6, 0,
		 EBPFLB_PIN_DIR "/ebpflb_sockrev6", BPF_F_NO_PREALLOC);

/* NodePort/LB flows: original tuple -> backend, SNAT, lifetime. The table itself
 * (ebpflb_ct4: an LRU hash of struct flow4 -> struct ct4_entry, at most EBPFLB_CT_MAX
 * entries) starts small and grows like the slot pool: the programs reach it through this
 * one-slot map (lib/conntrack.h ct4_table). */
BPF_TABLE_PINNED("array_of_maps$ebpflb_ct4", __u32, __u32, ebpflb_ct4ref,
		 1, EBPFLB_PIN_DIR "/ebpflb_ct4ref");

/* Reply tuple -> client view; also the SNAT port reservations. */
BPF_TABLE_PINNED("hash", struct flow4, struct rnat4_val, ebpflb_rnat4,
		 EBPFLB_RNAT_MAX, EBPFLB_PIN_DIR "/ebpflb_rnat4", BPF_F_NO_PREALLOC);

/* (service id, source prefix) allowed to reach a LoadBalancer IP with source ranges. */
BPF_TABLE_PINNED("lpm_trie", struct src_range4_key, __u8, ebpflb_srcrng4,
		 EBPFLB_SRC_RANGE_MAX, EBPFLB_PIN_DIR "/ebpflb_srcrng4", BPF_F_NO_PREALLOC);

/* IPv6 NodePort/LB flows: ebpflb_ct4ref's twin (ebpflb_ct6: an LRU hash of struct flow6
 * -> struct ct6_entry, at most EBPFLB_CT_MAX entries, grown like ebpflb_ct4). */
BPF_TABLE_PINNED("array_of_maps$ebpflb_ct6", __u32, __u32, ebpflb_ct6ref,
		 1, EBPFLB_PIN_DIR "/ebpflb_ct6ref");

/* IPv6 reply tuple -> client view; also the IPv6 SNAT port reservations. */
BPF_TABLE_PINNED("hash", struct flow6, struct rnat6_val, ebpflb_rnat6,
		 EBPFLB_RNAT_MAX, EBPFLB_PIN_DIR "/ebpflb_rnat6", BPF_F_NO_PREALLOC);

/* (service id, IPv6 source prefix) allowed to reach an IPv6 LoadBalancer IP. */
BPF_TABLE_PINNED("lpm_trie", struct src_range6_key, __u8, ebpflb_srcrng6,
		 EBPFLB_SRC_RANGE_MAX, EBPFLB_PIN_DIR "/ebpflb_srcrng6", BPF_F_NO_PREALLOC);

/* (service id, client) -> backend and last use: ClientIP session affinity. */
BPF_TABLE_PINNED("lru_hash", struct aff_key, struct aff_val, ebpflb_aff4,
		 EBPFLB_AFFINITY_MAX, EBPFLB_PIN_DIR "/ebpflb_aff4");

/* (service id, backend id) -> affinity timeout in seconds, written by the control plane
 * for the backends of every frontend with session affinity. */
BPF_TABLE_PINNED("hash", struct aff_match_key, __u32, ebpflb_affpair4,
		 EBPFLB_AFFINITY_MAX, EBPFLB_PIN_DIR "/ebpflb_affpair4", BPF_F_NO_PREALLOC);

/* ifindex -> the node address on it: the SNAT source of flows leaving through it (key 0:
 * the node's primary address, for interfaces without one). */
BPF_TABLE_PINNED("hash", __u32, __be32, ebpflb_ifaddr4,
		 EBPFLB_MAX_IFACES, EBPFLB_PIN_DIR "/ebpflb_ifaddr4", BPF_F_NO_PREALLOC);

/* ifindex -> the IPv6 node address on it: ebpflb_ifaddr4's twin. */
BPF_TABLE_PINNED("hash", __u32, struct addr6, ebpflb_ifaddr6,
		 EBPFLB_MAX_IFACES, EBPFLB_PIN_DIR "/ebpflb_ifaddr6", BPF_F_NO_PREALLOC);

/* ifindex -> the interface's MTU, written by the agent for every interface of the node's
 * namespace: the next hop's MTU where bpf_fib_lookup does not give it (5.10, and GRO
 * aggregates whose segments are checked). */
BPF_TABLE_PINNED("hash", __u32, __u32, ebpflb_ifmtu,
		 EBPFLB_MAX_IFACES, EBPFLB_PIN_DIR "/ebpflb_ifmtu", BPF_F_NO_PREALLOC);

/* (source, destination, protocol, id) of a fragmented datagram -> its ports, from its
 * first fragment, so its later fragments are translated as the first one was. */
BPF_TABLE_PINNED("lru_hash", struct frag4_key, struct frag_ports, ebpflb_frag4,
		 EBPFLB_FRAG_MAX, EBPFLB_PIN_DIR "/ebpflb_frag4");

/* (source, translated destination, protocol, id) of an IPv4 datagram the stack fragments
 * -> the source its fragments leave with (lib/frag.h). IPv6 needs none: its routers never
 * fragment, packet too big is always the answer. */
BPF_TABLE_PINNED("lru_hash", struct frag4_key, struct defer4_val, ebpflb_defer4,
		 EBPFLB_FRAG_MAX, EBPFLB_PIN_DIR "/ebpflb_defer4");

/* ebpflb_frag4's twin for IPv6 fragment headers. */
BPF_TABLE_PINNED("lru_hash", struct frag6_key, struct frag_ports, ebpflb_frag6,
		 EBPFLB_FRAG_MAX, EBPFLB_PIN_DIR "/ebpflb_frag6");

/* One element per CPU: the ICMP error path's working set (lib/icmp.h). */
BPF_TABLE_PINNED("percpu_array", __u32, struct scratch, ebpflb_scratch,
		 1, EBPFLB_PIN_DIR "/ebpflb_scratch");

/* Per-CPU event counters (STAT_*), summed by the agent at scrape time. */
BPF_TABLE_PINNED("percpu_array", __u32, __u64, ebpflb_stats,
		 STAT_MAX, EBPFLB_PIN_DIR "/ebpflb_stats");

/* Service id -> per-CPU counters of that frontend (lib/stats.h svc_stats_*), summed by the
 * agent at scrape time. Ids run from 1 to EBPFLB_MAX_SERVICES; element 0 is never used. */
BPF_TABLE_PINNED("percpu_array", __u32, struct lb_svc_stats, ebpflb_svcstats,
		 EBPFLB_MAX_SERVICES + 1, EBPFLB_PIN_DIR "/ebpflb_svcstats");

#endif /* EBPFLB_MAPS_H */
