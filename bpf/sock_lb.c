/* Socket-LB: cgroup sock_addr programs translating a frontend (ClusterIP:port) to a backend
 * when the socket addresses it, so no packet ever carries the ClusterIP and nothing is
 * NATed per packet. Attached to a cgroup v2 directory (BPF_F_ALLOW_MULTI) by
 * ebpflb/datapath/loader.py.
 *
 * Verdicts: SYS_PROCEED lets the syscall proceed (translated or not); SYS_REJECT makes it
 * fail (EPERM, or the errno set by lb_set_refused()). recvmsg4 and getpeername4 must always
 * proceed.
 */
#include <uapi/linux/bpf.h>
#include <linux/in.h>

#include "lib/hash.h"
#include "lib/lb.h"
#include "lib/stats.h"

/* What a cgroup sock_addr program returns. */
enum sys_verdict {
	SYS_REJECT = 0,
	SYS_PROCEED = 1,
};

/* Translate ctx's destination if it is a frontend; `hash` picks the Maglev slot. */
static __always_inline enum sys_verdict sock4_xlate_fwd(struct bpf_sock_addr *ctx, __u32 hash,
							__u32 stat, bool check_first)
{
	__be32 vaddr = ctx->user_ip4;
	__be16 vport = (__be16)ctx->user_port;
	struct lb4_svc_val *svc;
	struct lb4_backend *backend;
	__u32 backend_id;
	__u64 client;

	svc = lb4_lookup_service_in_node(vaddr, vport, (__u8)ctx->protocol);
	if (!svc)
		return SYS_PROCEED; /* not a frontend: leave the socket alone */
	/* A pod's client is its network namespace; a host process's, the host's. Only
	 * session affinity needs to know it. */
	client = svc->flags & SVC_F_AFFINITY ? bpf_get_netns_cookie(ctx) : 0;
	backend = lb4_pick_backend(svc, hash, client, 1, &backend_id);
	if (!backend) {
		stat_inc(STAT_NO_BACKEND);
		svc_stats_refused(svc->svc_id);
		lb_set_refused();
		return SYS_REJECT;
	}
#if EBPFLB_HAVE_SK_STORAGE
	/* A TCP socket has one peer: its entry lives in the socket. A UDP socket may send to
	 * many frontends (one entry per backend) and the stale-UDP cleanup must find sockets
	 * by backend: its entries stay in the LRU. */
	if (ctx->protocol == IPPROTO_TCP)
		lb4_sockrev_store(ctx->sk, backend, vaddr, vport);
	else
#endif
		lb4_revsk_store(bpf_get_socket_cookie(ctx), backend, vaddr, vport, check_first);
	ctx->user_ip4 = backend->addr;
	ctx->user_port = (__u32)backend->port;
	stat_inc(stat);
	svc_stats_sock_xlated(svc->svc_id);
	return SYS_PROCEED;
}

/* Show the frontend instead of the backend the socket really talks to. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx, __u32 stat)
{
	struct lb4_revsk_val *frontend;

#if EBPFLB_HAVE_SK_STORAGE
	if (ctx->protocol == IPPROTO_TCP) {
		struct lb4_sock_rev *rev;

		rev = lb4_sockrev_lookup(ctx->sk, ctx->user_ip4, (__be16)ctx->user_port);
		if (rev) {
			ctx->user_ip4 = rev->frontend_addr;
			ctx->user_port = (__u32)rev->frontend_port;
			stat_inc(stat);
			return;
		}
		/* Else a socket connected before the agent switched to socket storage. */
	}
#endif
	frontend = lb4_revsk_lookup(bpf_get_socket_cookie(ctx), ctx->user_ip4,
				    (__be16)ctx->user_port);
	if (!frontend)
		return;
	ctx->user_ip4 = frontend->addr;
	ctx->user_port = (__u32)frontend->port;
	stat_inc(stat);
}

/* connect(): TCP and connected UDP. A uniformly random slot per connect. */
int ebpflb_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, bpf_get_prandom_u32(), STAT_CONNECT_XLATED, false);
}

/* sendmsg() with a destination (unconnected UDP). The slot is a hash of the socket
 * cookie, so all datagrams of one socket reach one backend while the table is unchanged,
 * as conntrack makes kube-proxy's DNAT sticky per flow. */
int ebpflb_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, mix64(bpf_get_socket_cookie(ctx)), STAT_SENDMSG_XLATED,
			       true);
}

/* recvmsg() on UDP: the datagram's source becomes the frontend the socket sent to. */
int ebpflb_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx, STAT_RECVMSG_XLATED);
	return SYS_PROCEED;
}

/* getpeername(): a connected socket's peer is reported as the frontend. */
int ebpflb_getpeer4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx, STAT_PEER_XLATED);
	return SYS_PROCEED;
}
