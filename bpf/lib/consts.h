/* Sizes, flags and counter indexes shared by every ebpflb program.
 *
 * The configurable sizes are #ifndef-overridable: the agent passes the configured values
 * as -D flags (ebpflb/datapath/contract/ DEFINES, Config.cflags()), so Python owns the
 * numbers and C keeps defaults that let a file compile on its own. Everything Python also
 * needs (fixed sizes, flags, counter indexes) is mirrored in ebpflb/datapath/contract/ and compared with
 * this file by tests/unit/datapath/test_contract.py.
 */
#ifndef EBPFLB_CONSTS_H
#define EBPFLB_CONSTS_H

/* Where maps are pinned (a bpffs directory); a restarted agent and `ebpflb maps dump`
 * open the same pins. */
#ifndef EBPFLB_PIN_DIR
#define EBPFLB_PIN_DIR "/sys/fs/bpf/ebpflb"
#endif

/* Frontends (VIP:port/proto) in ebpflb_svc4. Cilium's bpf.lbMapMax default. */
#ifndef EBPFLB_MAX_SERVICES
#define EBPFLB_MAX_SERVICES 65536
#endif

/* Distinct backends (ip:port/proto) in ebpflb_be4; shared by every service using them. */
#ifndef EBPFLB_MAX_BACKENDS
#define EBPFLB_MAX_BACKENDS 65536
#endif

/* Slots in the shared Maglev slot pool (ebpflb_slots), even. Each frontend owns one
 * contiguous range of a prime length M >= 100 x its backends (padded to a pair), so memory
 * follows the number of backends, not services x a fixed maximum. Two slots share one
 * 8-byte array element (the kernel rounds every array value up to 8 bytes): 8 Mi slots
 * = 32 MiB, enough for 16,000 services of 3 backends (M = 509). */
#ifndef EBPFLB_SLOT_POOL_SIZE
#define EBPFLB_SLOT_POOL_SIZE 8388608
#endif

/* Socket reverse-translation entries (ebpflb_revsk4), one per (socket, backend) in use;
 * LRU, so a full map evicts the coldest socket's entry instead of failing a connect(). */
#ifndef EBPFLB_REV_SK_MAX
#define EBPFLB_REV_SK_MAX 262144
#endif

/* NodePort/LoadBalancer conntrack entries (ebpflb_ct4, LRU): one per flow through this
 * node's interfaces. Cilium's default is 512k TCP + 256k other; kube-proxy's nf_conntrack
 * minimum is 128k. */
#ifndef EBPFLB_CT_MAX
#define EBPFLB_CT_MAX 262144
#endif

/* Reply-translation entries (ebpflb_rnat4): one per flow, keyed by the reply's tuple. A
 * plain hash, not LRU: an entry is reused only after its flow idled out, never evicted
 * under a live flow (eviction could hand its SNAT port to another client). */
#ifndef EBPFLB_RNAT_MAX
#define EBPFLB_RNAT_MAX 262144
#endif

/* loadBalancerSourceRanges prefixes (ebpflb_srcrng4, LPM trie), over all services. */
#ifndef EBPFLB_SRC_RANGE_MAX
#define EBPFLB_SRC_RANGE_MAX 16384
#endif

/* ClientIP session affinity: client entries (ebpflb_aff4, LRU: the coldest client's
 * entry goes first when full, costing it its affinity, never a connection), and
 * (service id, backend id) pairs that may be chosen by affinity (ebpflb_affpair4).
 * Cilium's affinity map default. */
#ifndef EBPFLB_AFFINITY_MAX
#define EBPFLB_AFFINITY_MAX 65536
#endif

/* Interfaces with a node address or an MTU the programs need (ebpflb_ifaddr4,
 * ebpflb_ifaddr6, ebpflb_ifmtu): every interface of the node's network namespace with an
 * address (the SNAT source is the egress interface's), and key 0 for the node's primary
 * address (egress interfaces with none of their own). */
#define EBPFLB_MAX_IFACES 64

/* Fragmented datagrams in flight whose first fragment's ports are remembered
 * (ebpflb_frag4, ebpflb_frag6; LRU: an old datagram's entry goes first). Cilium's
 * bpf-fragments-map-max default. */
#define EBPFLB_FRAG_MAX 8192

/* Bytes of the per-CPU scratch element (ebpflb_scratch): the ICMP path's working set. */
#define EBPFLB_SCRATCH_SIZE 512

/* SNAT source ports, host order, inclusive: by default outside Linux's ephemeral ports
 * (net.ipv4.ip_local_port_range 32768-60999) and the NodePort range; the agent places
 * them from the node's actual range (config.py, place_snat_ports). */
#ifndef EBPFLB_SNAT_PORT_MIN
#define EBPFLB_SNAT_PORT_MIN 1024
#endif
#ifndef EBPFLB_SNAT_PORT_MAX
#define EBPFLB_SNAT_PORT_MAX 29999
#endif
/* Ports tried per new SNATed flow before counting STAT_SNAT_EXHAUSTED (unrolled: each
 * try costs instructions in the verifier's budget). */
#define EBPFLB_SNAT_TRIES 32

/* Seed of the 5-tuple hash that picks a NodePort flow's Maglev slot. Derived from the
 * cluster-wide --hash-seed, so every node picks the same backend for the same flow. */
#ifndef EBPFLB_FLOW_HASH_SEED
#define EBPFLB_FLOW_HASH_SEED 0x6562706cU
#endif

#define EBPFLB_NSEC_PER_SEC 1000000000ULL /* bpf_ktime_get_ns() units */

/* Conntrack lifetimes in seconds (Cilium's defaults): a TCP flow before its handshake
 * completes, an established TCP flow, a TCP flow after FINs of both sides or a RST, a UDP
 * flow; and a half-closed TCP flow (one side's FIN: nf_conntrack's CLOSE_WAIT, kube-proxy's
 * 3,600 s), whose other side may keep sending for as long as it likes. */
#ifndef EBPFLB_CT_TCP_SYN_TIMEOUT
#define EBPFLB_CT_TCP_SYN_TIMEOUT 60
#endif
#ifndef EBPFLB_CT_TCP_TIMEOUT
#define EBPFLB_CT_TCP_TIMEOUT 21600
#endif
#ifndef EBPFLB_CT_TCP_CLOSE_TIMEOUT
#define EBPFLB_CT_TCP_CLOSE_TIMEOUT 10
#endif
#ifndef EBPFLB_CT_TCP_CLOSE_WAIT_TIMEOUT
#define EBPFLB_CT_TCP_CLOSE_WAIT_TIMEOUT 3600
#endif
#ifndef EBPFLB_CT_UDP_TIMEOUT
#define EBPFLB_CT_UDP_TIMEOUT 60
#endif

/* Bytes for "namespace/name:port" in ebpflb_svcmeta: 63 + 1 + 63 + 1 + 15 = 143 (+ NUL). */
#define EBPFLB_SVC_NAME_LEN 144

/* --socket-lb=hostns-only: the network namespace cookie of the agent's namespace (the
 * host's); socket-LB then translates only that namespace's sockets. 0: every socket. */
#ifndef EBPFLB_SOCK_NETNS_COOKIE
#define EBPFLB_SOCK_NETNS_COOKIE 0ULL
#endif

/* 1 when bpf/nodeport.c is compiled for pod interfaces (ebpflb_pod_in/out, the per-packet
 * ClusterIP path): frontends looked up as in-node clients see them, and SNAT only for a pod
 * reaching itself through its Service (hairpin). 0: the node's interfaces (NodePort). */
#ifndef EBPFLB_POD_PATH
#define EBPFLB_POD_PATH 0
#endif

/* Set by the agent's feature probe when the kernel has bpf_set_retval (5.18+). Without it a
 * refused connect() fails with EPERM instead of ECONNREFUSED. */
#ifndef EBPFLB_HAVE_SET_RETVAL
#define EBPFLB_HAVE_SET_RETVAL 0
#endif

/* Set by the agent's feature probe when sock_addr programs may call bpf_sk_storage_get
 * (5.3) and --socket-storage is on: TCP sockets' reverse entries go to ebpflb_sockrev4
 * instead of the LRU ebpflb_revsk4. */
#ifndef EBPFLB_HAVE_SK_STORAGE
#define EBPFLB_HAVE_SK_STORAGE 0
#endif

/* lb4_svc_key.scope: which backend set a frontend lookup wants. */
#define LB_SCOPE_EXTERNAL 0 /* the entry every hook looks up first */
#define LB_SCOPE_INTERNAL 1 /* in-node clients' entry, when SVC_F_INTERNAL_SCOPE says so */

/* lb_svc_val.flags: service type of the frontend and per-service behaviour. */
#define SVC_F_CLUSTER_IP    (1 << 0) /* frontend is the ClusterIP */
#define SVC_F_NODE_PORT     (1 << 1) /* frontend is a node address on its nodePort */
#define SVC_F_LOADBALANCER  (1 << 2) /* frontend is a status.loadBalancer ingress IP */
#define SVC_F_EXTERNAL_IP   (1 << 3) /* frontend is one of spec.externalIPs */
#define SVC_F_TERMINATING   (1 << 4) /* only serving+terminating endpoints are left */
#define SVC_F_ETP_LOCAL     (1 << 5) /* externalTrafficPolicy=Local: local backends, no SNAT */
#define SVC_F_SOURCE_RANGES (1 << 6) /* loadBalancerSourceRanges: check ebpflb_srcrng4 */
#define SVC_F_ITP_LOCAL     (1 << 7) /* internalTrafficPolicy=Local: local backends only */
/* In-node clients (socket-LB) use this frontend's LB_SCOPE_INTERNAL entry: set on the
 * external entry of an externalTrafficPolicy=Local frontend, whose own (external) entry
 * holds the local backends while traffic from inside the cluster may reach all of them. */
#define SVC_F_INTERNAL_SCOPE (1 << 8)
/* sessionAffinity=ClientIP: a client's new connections reuse its last backend while
 * ebpflb_affpair4[(svc_id, backend)] exists and its timeout has not passed. */
#define SVC_F_AFFINITY      (1 << 9)
/* No usable endpoint in the whole service: external traffic is answered with a TCP RST or
 * an ICMP port unreachable (kube-proxy's REJECT) instead of dropped. Not set when externalTrafficPolicy=Local has
 * endpoints on other nodes only: that traffic is dropped, as kube-proxy does. */
#define SVC_F_REJECT        (1 << 10)

/* Frontends the tc/xdp programs serve; a ClusterIP is never reachable from outside. */
#define SVC_F_EXTERNAL (SVC_F_NODE_PORT | SVC_F_LOADBALANCER | SVC_F_EXTERNAL_IP)

/* src_range4_key.prefixlen: the service id's bits come first, then the source prefix. */
#define SRC_RANGE_ID_PREFIXLEN    32
#define SRC_RANGE_EXACT_PREFIXLEN (SRC_RANGE_ID_PREFIXLEN + 32) /* one source address */
#define SRC_RANGE6_EXACT_PREFIXLEN (SRC_RANGE_ID_PREFIXLEN + 128) /* one IPv6 source */

/* aff_key.netns: what aff_key.client identifies. */
#define AFF_CLIENT_ADDR4 0 /* tc/XDP: an IPv4 source address (its first four bytes) */
#define AFF_CLIENT_NETNS 1 /* socket-LB: the client's network namespace cookie */
#define AFF_CLIENT_ADDR6 2 /* tc/XDP: an IPv6 source address folded to 64 bits */

/* ct4_entry.flags. */
#define CT_F_SNAT       (1 << 0) /* source rewritten to nat_addr:nat_port */
#define CT_F_REPLY_SEEN (1 << 1) /* the backend answered */
#define CT_F_CLOSING    (1 << 2) /* TCP: RST, or FINs of both sides, seen: short lifetime */
#define CT_F_ESTABLISHED (1 << 3) /* TCP: client ACKed after the backend answered */
#define CT_F_FIN_CLIENT  (1 << 4) /* TCP: the client sent FIN (half-closed until both have) */
#define CT_F_FIN_BACKEND (1 << 5) /* TCP: the backend sent FIN */
#define CT_MASK_ENDING (CT_F_CLOSING | CT_F_FIN_CLIENT | CT_F_FIN_BACKEND) /* any of the three */

/* rnat4_val.flags: which hook uses the entry. */
#define RNAT_F_SNAT (1 << 0) /* reply to a SNATed flow, matched on ingress (dst = nat addr) */

/* lb4_backend.flags. */
#define BE_F_LOCAL       (1 << 0) /* endpoint runs on this node */
#define BE_F_TERMINATING (1 << 1) /* endpoint is terminating (used only when nothing is ready) */

/* Indexes into the per-CPU ebpflb_stats array, one per event (lib/stats.h counts them);
 * mirrored by ebpflb.datapath.contract.Counter, whose lower-cased names label the
 * ebpflb_datapath_events metric. */
#define STAT_CONNECT_XLATED  0 /* connect() to a frontend rewritten to a backend */
#define STAT_SENDMSG_XLATED  1 /* sendmsg() to a frontend rewritten to a backend */
#define STAT_RECVMSG_XLATED  2 /* recvmsg() source rewritten back to the frontend */
#define STAT_PEER_XLATED     3 /* getpeername() rewritten back to the frontend */
#define STAT_NO_BACKEND      4 /* refused: the service has no usable backend */
#define STAT_SLOT_MISS       5 /* slot or backend missing: a control-plane ordering bug */
#define STAT_REVSK_UPDATE_FAIL 6 /* reverse entry not stored: getpeername/recvmsg will miss */
#define STAT_NP_NEW_FLOW     7 /* new NodePort/LB/external flow DNATed (tc or xdp) */
#define STAT_NP_FWD          8 /* packet of a known flow translated towards its backend */
#define STAT_NP_REPLY        9 /* reply translated back to the client's view */
#define STAT_NP_NO_BACKEND   10 /* dropped: no usable (for Local: no local) backend */
#define STAT_SNAT_EXHAUSTED  11 /* dropped: every SNAT port tried is held by a live flow */
#define STAT_SRC_RANGE_DROP  12 /* dropped: source outside loadBalancerSourceRanges */
#define STAT_CT_CREATE_FAIL  13 /* dropped: conntrack entry could not be stored */
#define STAT_FRAGMENT        14 /* IP fragment translated (ports: its datagram's first fragment's) */
#define STAT_FIB_FAIL        15 /* dropped: no route for a translated packet */
#define STAT_SNAT_NO_ADDR    16 /* dropped: SNAT needed, no node address on the interface */
#define STAT_RNAT_STORE_FAIL 17 /* dropped: reply translation not stored (ebpflb_rnat4 full) */
#define STAT_AFFINITY_HIT    18 /* new connection sent to the client's affinity backend */
#define STAT_NP_REJECT       19 /* RST / ICMP port unreachable sent (SVC_F_REJECT) */
#define STAT_NP6_EXT_HEADER  20 /* IPv6 extension headers not walked: passed untranslated */
#define STAT_MTU_EXCEEDED    21 /* dropped: too big for the next hop, and neither answered nor fragmented */
#define STAT_ICMP_XLATED     22 /* ICMP/ICMPv6 error about a translated flow translated back */
#define STAT_TOO_BIG_SENT    23 /* fragmentation needed / packet too big sent back for a packet */
#define STAT_FRAG_UNKNOWN    24 /* later fragment of no remembered datagram: passed untranslated */
#define STAT_FRAGMENTED      25 /* too big without DF: handed to the stack to fragment (IPv4) */
#define STAT_MAX             32 /* array size; spare room for new counters */

#endif /* EBPFLB_CONSTS_H */
