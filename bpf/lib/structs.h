/* Every map key and value. Mirrored field for field by ctypes classes in
 * ebpflb/datapath/contract/ (tests/unit/datapath/test_contract.py compares names, order, sizes and
 * byte order with this file; tests/kernel/datapath/test_layout.py with BCC's generated Key/Leaf
 * types). Padding is explicit so both sides agree without relying on compiler layout.
 * Fields typed __be* hold network byte order. A struct serving both families has no family
 * in its name (lb_svc_val, aff_key...); a family's struct sits right before (IPv4) or after
 * (IPv6) its twin.
 */
#ifndef EBPFLB_STRUCTS_H
#define EBPFLB_STRUCTS_H

#include "consts.h"

/* A frontend: what a client addresses (ClusterIP, node IP + nodePort, LB IP, external IP). */
struct lb4_svc_key {
	__be32 addr;  /* frontend IPv4 address */
	__be16 port;  /* frontend port */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;   /* LB_SCOPE_*: which backend set this entry describes */
};

/* An IPv6 frontend: the key of ebpflb_svc6. Its value is a struct lb_svc_val, as an IPv4
 * frontend's: service ids, the Maglev slot pool and its table layout are shared by both
 * families; only the backend ids in an IPv6 frontend's table index ebpflb_be6. */
struct lb6_svc_key {
	__be32 addr[4]; /* frontend IPv6 address */
	__be16 port;    /* frontend port */
	__u8 proto;     /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;     /* LB_SCOPE_* */
};

/* Where a frontend's Maglev table lives. Invariant: table_size == 0 <=> no usable backend
 * (the programs refuse); otherwise slots [table_off, table_off + table_size) of
 * ebpflb_slots each hold a backend id present in ebpflb_be4; table_off is even. */
struct lb_svc_val {
	__u32 svc_id;        /* dense service id, key of ebpflb_svcmeta */
	__u32 table_off;     /* first slot of the table in ebpflb_slots */
	__u32 table_size;    /* M, a prime; 0 = refuse */
	__u16 backend_count; /* backends holding slots (for dumps; the datapath uses M) */
	__u16 flags;         /* SVC_F_* */
};

/* Two consecutive Maglev slots: element k of ebpflb_slots holds slots 2k and 2k+1.
 * Tables start at even slots, so no element is shared by two tables. */
struct lb_slot_pair {
	__u32 backend_id[2]; /* backend id in slot 2k, 2k+1; 0 = empty */
};

/* A backend: what a frontend is translated to. Index of ebpflb_be4 is a dense __u32 id;
 * id 0 is never allocated so an all-zero slot is recognisably empty. An element with
 * proto 0 (all zero: never written, or removed) is no backend. */
struct lb4_backend {
	__be32 addr;  /* endpoint IPv4 address */
	__be16 port;  /* endpoint (target) port */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 flags;   /* BE_F_* */
};

/* An IPv6 backend: element of ebpflb_be6, indexed by a backend id from the same id space
 * as ebpflb_be4's (an id names a backend of one family only). All zero: no backend. */
struct lb6_backend {
	__be32 addr[4]; /* endpoint IPv6 address */
	__be16 port;    /* endpoint (target) port */
	__u8 proto;     /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 flags;     /* BE_F_* */
};

/* Control-plane metadata for a service id, read by `ebpflb maps dump` and by a restarted
 * agent; the programs never read it. */
struct lb_svc_meta {
	char name[EBPFLB_SVC_NAME_LEN]; /* "namespace/name:port", NUL-terminated */
};

/* Socket-LB reverse translation: which frontend a socket's backend stands for, so
 * recvmsg4/getpeername4 can show the frontend. Keyed per socket because two sockets may
 * reach the same backend through different frontends. */
struct lb4_revsk_key {
	__u64 cookie; /* bpf_get_socket_cookie() of the client socket */
	__be32 addr;  /* backend IPv4 address the socket was sent to */
	__be16 port;  /* backend port */
	__u16 pad;    /* zero */
};

struct lb4_revsk_val {
	__be32 addr;  /* frontend address the application asked for */
	__be16 port;  /* frontend port */
	__u16 pad;    /* zero */
};

/* Socket-LB reverse translation of an IPv6 socket: key of ebpflb_revsk6 (UDP, and TCP
 * without EBPFLB_HAVE_SK_STORAGE; a socket talking to an IPv4-mapped frontend uses the
 * IPv4 entries instead). */
struct lb6_revsk_key {
	__u64 cookie;   /* bpf_get_socket_cookie() of the client socket */
	__be32 addr[4]; /* backend IPv6 address the socket was sent to */
	__be16 port;    /* backend port */
	__u16 pad[3];   /* zero */
};

struct lb6_revsk_val {
	__be32 addr[4]; /* frontend address the application asked for */
	__be16 port;    /* frontend port */
	__u16 pad;      /* zero */
};

/* Value of ebpflb_sockrev4 (socket storage): what a TCP socket's connect() was translated
 * from and to. The backend is kept so that a socket whose later connect() was not
 * translated (a retry to another address) is not shown a stale frontend. */
struct lb4_sock_rev {
	__be32 backend_addr;  /* the backend connect() was sent to */
	__be32 frontend_addr; /* the frontend the application asked for */
	__be16 backend_port;
	__be16 frontend_port;
};

/* Value of ebpflb_sockrev6 (socket storage): struct lb4_sock_rev's twin for a TCP
 * socket connected to an IPv6 frontend. */
struct lb6_sock_rev {
	__be32 backend_addr[4];  /* the backend connect() was sent to */
	__be32 frontend_addr[4]; /* the frontend the application asked for */
	__be16 backend_port;
	__be16 frontend_port;
};

/* A flow as the wire shows it in one direction: the key of ebpflb_ct4 (client -> frontend,
 * as the client sent it) and of ebpflb_rnat4 (backend -> where the backend replies to). */
struct flow4 {
	__be32 saddr; /* source address */
	__be32 daddr; /* destination address */
	__be16 sport; /* source port */
	__be16 dport; /* destination port */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];  /* zero */
};

/* struct flow4's twin for IPv6: the key of ebpflb_ct6 (client -> frontend) and of
 * ebpflb_rnat6 (backend -> where the backend replies to). */
struct flow6 {
	__be32 saddr[4]; /* source address */
	__be32 daddr[4]; /* destination address */
	__be16 sport;    /* source port */
	__be16 dport;    /* destination port */
	__u8 proto;      /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];     /* zero */
};

/* One NodePort/LoadBalancer/external-IP flow: where its packets go. Holds the backend's
 * address itself, so the flow keeps its backend after the backend leaves the service. */
struct ct4_entry {
	__be32 backend_addr; /* DNAT destination */
	__be16 backend_port; /* DNAT destination port */
	__u16 flags;         /* CT_F_* */
	__be32 nat_addr;     /* SNAT source (node address), if CT_F_SNAT */
	__be16 nat_port;     /* SNAT source port, if CT_F_SNAT */
	__u16 pad;           /* zero */
	__u32 svc_id;        /* service of the frontend (dumps) */
	__u32 backend_id;    /* backend id at creation (dumps; may be gone since) */
	__u64 expires;       /* bpf_ktime_get_ns() after which the entry is dead */
	__u64 packets;       /* client -> backend packets */
	__u64 bytes;         /* client -> backend bytes */
};

/* struct ct4_entry's twin: one IPv6 NodePort/LoadBalancer/external-IP flow. */
struct ct6_entry {
	__be32 backend_addr[4]; /* DNAT destination */
	__be32 nat_addr[4];     /* SNAT source (node address), if CT_F_SNAT */
	__be16 backend_port;    /* DNAT destination port */
	__u16 flags;            /* CT_F_* */
	__be16 nat_port;        /* SNAT source port, if CT_F_SNAT */
	__u16 pad;              /* zero */
	__u32 svc_id;           /* service of the frontend (dumps) */
	__u32 backend_id;       /* backend id at creation (dumps; may be gone since) */
	__u64 expires;          /* bpf_ktime_get_ns() after which the entry is dead */
	__u64 packets;          /* client -> backend packets */
	__u64 bytes;            /* client -> backend bytes */
};

/* How to undo a flow's translation on its replies: the client's original view. */
struct rnat4_val {
	__be32 client_addr;   /* where the reply must go */
	__be32 frontend_addr; /* what the reply must come from */
	__be16 client_port;   /* client's port */
	__be16 frontend_port; /* frontend port */
	__u16 flags;          /* RNAT_F_* */
	__u16 pad;            /* zero */
	__u64 expires;        /* bpf_ktime_get_ns() after which the SNAT port may be reused */
};

/* struct rnat4_val's twin: how to restore an IPv6 client's view on the way back. */
struct rnat6_val {
	__be32 client_addr[4];   /* where the reply must go */
	__be32 frontend_addr[4]; /* what the reply must come from */
	__be16 client_port;      /* client's port */
	__be16 frontend_port;    /* frontend port */
	__u16 flags;             /* RNAT_F_* */
	__u16 pad;               /* zero */
	__u64 expires;           /* bpf_ktime_get_ns() after which the SNAT port may be reused */
};

/* loadBalancerSourceRanges entry: LPM key over (service id, source prefix). prefixlen
 * counts the bits of svc_id (SRC_RANGE_ID_PREFIXLEN) plus the prefix length. */
struct src_range4_key {
	__u32 prefixlen; /* SRC_RANGE_ID_PREFIXLEN + CIDR prefix length */
	__u32 svc_id;    /* LoadBalancer frontend's service id, big-endian for the LPM match */
	__be32 addr;     /* allowed source prefix */
};

/* struct src_range4_key's twin: an IPv6 loadBalancerSourceRanges prefix. prefixlen
 * counts the bits of svc_id (SRC_RANGE_ID_PREFIXLEN) plus the prefix length. */
struct src_range6_key {
	__u32 prefixlen; /* SRC_RANGE_ID_PREFIXLEN + CIDR prefix length */
	__u32 svc_id;    /* LoadBalancer frontend's service id, big-endian for the LPM match */
	__be32 addr[4];  /* allowed source prefix */
};

/* Value of ebpflb_ifaddr6: the IPv6 node address IPv6 flows arriving on an interface are
 * SNATed to. */
struct addr6 {
	__be32 addr[4]; /* a global IPv6 address of the interface */
};

/* A fragmented IPv4 datagram: the key of ebpflb_frag4 (RFC 791: source, destination,
 * protocol and identification name one datagram). */
struct frag4_key {
	__be32 saddr; /* source address */
	__be32 daddr; /* destination address */
	__be16 id;    /* IP identification */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;     /* zero */
};

/* struct frag4_key's twin: an IPv6 datagram in fragments (its fragment header's id). */
struct frag6_key {
	__be32 saddr[4]; /* source address */
	__be32 daddr[4]; /* destination address */
	__be32 id;       /* the fragment header's identification */
	__u8 proto;      /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];     /* zero */
};

/* The source an IPv4 packet handed to the stack to fragment (too big for the next hop, DF
 * clear) gets on its way out, with the datagram's id in the key (struct frag4_key, its
 * destination already translated): every fragment the stack makes of it finds it. */
struct defer4_val {
	__be32 saddr; /* the node address it leaves from (SNAT, or the frontend of a reply) */
	__be16 sport; /* and port (the first fragment's L4 header) */
	__u16 pad;    /* zero */
};

/* The ports of a fragmented datagram, from its first fragment: the later ones follow. */
struct frag_ports {
	__be16 sport; /* source port */
	__be16 dport; /* destination port */
};

/* Per-CPU room for the ICMP error path's working set (lib/icmp.h struct icmp4_work and
 * icmp6_work: the packet, what it is about, copies of the embedded headers it rewrites):
 * next to the rest of a tc program's path they do not fit its 512-byte stack. Opaque
 * here: only that path reads it, and only while it runs (the element is this CPU's). */
struct scratch {
	__u8 bytes[EBPFLB_SCRATCH_SIZE]; /* the path's struct, at the start */
};

/* Per-frontend datapath counters: value of the per-CPU ebpflb_svcstats, keyed by
 * lb_svc_val.svc_id (the agent zeroes an id's element before a new frontend takes it). */
struct lb_svc_stats {
	__u64 sock_xlated; /* socket-LB: connect()/sendmsg() translated to a backend */
	__u64 refused;     /* refused (socket-LB) or dropped (NodePort): no usable backend */
	__u64 np_flows;    /* NodePort/LB/external-IP flows started towards a backend */
	__u64 np_packets;  /* NodePort/LB/external-IP packets translated towards a backend */
	__u64 np_bytes;    /* their bytes, as the hook saw them (L2 header included) */
};

/* ClientIP session affinity: one client of one frontend. */
struct aff_key {
	__u64 client; /* AFF_CLIENT_*: a netns cookie, an IPv4 address, an IPv6 one folded */
	__u32 svc_id; /* the frontend's service id */
	__u8 netns;   /* AFF_CLIENT_*: what `client` is */
	__u8 pad[3];  /* zero */
};

/* The backend a client was last sent to, and when. */
struct aff_val {
	__u64 last_used;  /* bpf_ktime_get_ns() of the client's last new connection */
	__u32 backend_id; /* key of ebpflb_be4 */
	__u32 pad;        /* zero */
};

/* Key of ebpflb_affpair4: present while the backend is one of the frontend's backends,
 * its value the frontend's affinity timeout in seconds. An affinity entry naming a backend
 * that left (or a frontend whose affinity was switched off) is then ignored at once. */
struct aff_match_key {
	__u32 svc_id;     /* the frontend's service id */
	__u32 backend_id; /* a backend of its table */
};

#endif /* EBPFLB_STRUCTS_H */
