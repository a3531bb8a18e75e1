/* Every map key and value. Mirrored field for field by ctypes classes in
 * ebpflb/datapath/layout.py; tests/kernel/test_layout.py checks sizes and offsets against
 * BCC's generated Key/Leaf types. Padding is explicit so both sides agree without relying
 * on compiler layout. Fields typed __be* hold network byte order.
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

/* Where a frontend's Maglev table lives. Invariant: table_size == 0 <=> no usable backend
 * (the programs refuse); otherwise slots [table_off, table_off + table_size) of
 * ebpflb_slots each hold a backend id present in ebpflb_be4. */
struct lb4_svc_val {
	__u32 svc_id;        /* dense service id, key of ebpflb_svcmeta */
	__u32 table_off;     /* first slot of the table in ebpflb_slots */
	__u32 table_size;    /* M, a prime; 0 = refuse */
	__u16 backend_count; /* backends holding slots (for dumps; the datapath uses M) */
	__u16 flags;         /* SVC_F_* */
};

/* A backend: what a frontend is translated to. Key of ebpflb_be4 is a dense __u32 id;
 * id 0 is never allocated so an all-zero slot is recognisably empty. */
struct lb4_backend {
	__be32 addr;  /* endpoint IPv4 address */
	__be16 port;  /* endpoint (target) port */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 flags;   /* BE_F_* */
};

/* Control-plane metadata for a service id, read by `ebpflb maps dump` and by a restarted
 * agent; the programs never read it. */
struct lb4_svc_meta {
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

#endif /* EBPFLB_STRUCTS_H */
