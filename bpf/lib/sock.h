/* Socket-LB translation shared by the sock_addr entry points of bpf/sock_lb.c: forward
 * (frontend -> backend, at connect()/sendmsg()) and reverse (backend -> frontend, at
 * recvmsg()/getpeername()), for IPv4 sockets, IPv6 sockets, and IPv6 sockets addressing
 * an IPv4-mapped address (::ffff:a.b.c.d), which the kernel then serves over IPv4: those
 * are translated by the IPv4 tables and answer with the mapped form of the IPv4 frontend.
 */
#ifndef EBPFLB_SOCK_H
#define EBPFLB_SOCK_H

#include "lb.h"
#include "stats.h"

/* What a cgroup sock_addr program returns. */
enum sys_verdict {
	SYS_REJECT = 0,
	SYS_PROCEED = 1,
};

/* Whether socket-LB translates this socket: every socket, or with --socket-lb=hostns-only
 * only those of the agent's (the host's) network namespace. A pod's are then left to the
 * per-packet path on its interface, where a sidecar's iptables REDIRECT still sees the
 * ClusterIP it asked for (SO_ORIGINAL_DST). Reverse translations need no check: a socket
 * left alone has no reverse entry. */
static __always_inline bool sock_in_scope(struct bpf_sock_addr *ctx)
{
	return !EBPFLB_SOCK_NETNS_COOKIE || bpf_get_netns_cookie(ctx) == EBPFLB_SOCK_NETNS_COOKIE;
}

/* Refuse a connect()/sendmsg() to a frontend without usable backend, counted. */
static __always_inline enum sys_verdict sock_refuse(const struct lb_svc_val *svc)
{
	stat_inc(STAT_NO_BACKEND);
	svc_stats_refused(svc->svc_id);
	lb_set_refused();
	return SYS_REJECT;
}

/* Translate the IPv4 destination *addr:*port in place if it is a frontend; `hash` picks
 * the Maglev slot. The socket may be an IPv6 one (an IPv4-mapped destination): its reverse
 * entries are the IPv4 ones, keyed by the same socket cookie or in the same socket. */
static __always_inline enum sys_verdict sock4_xlate_fwd(struct bpf_sock_addr *ctx, __be32 *addr,
							__be16 *port, __u32 hash, __u32 stat,
							bool check_first)
{
	__be32 vaddr = *addr;
	__be16 vport = *port;
	struct lb_svc_val *svc;
	struct lb4_backend *backend;
	__u32 backend_id;
	__u64 client;

	if (!sock_in_scope(ctx))
		return SYS_PROCEED;
	svc = lb4_lookup_service_in_node(vaddr, vport, (__u8)ctx->protocol);
	if (!svc)
		return SYS_PROCEED; /* not a frontend: leave the socket alone */
	/* A pod's client is its network namespace; a host process's, the host's. Only
	 * session affinity needs to know it. */
	client = svc->flags & SVC_F_AFFINITY ? bpf_get_netns_cookie(ctx) : 0;
	backend = lb4_pick_backend(svc, hash, client, AFF_CLIENT_NETNS, &backend_id);
	if (!backend)
		return sock_refuse(svc);
#if EBPFLB_HAVE_SK_STORAGE
	/* A TCP socket has one peer: its entry lives in the socket. A UDP socket may send to
	 * many frontends (one entry per backend) and the stale-UDP cleanup must find sockets
	 * by backend: its entries stay in the LRU. */
	if (ctx->protocol == IPPROTO_TCP)
		lb4_sockrev_store(ctx->sk, backend, vaddr, vport);
	else
#endif
		lb4_revsk_store(bpf_get_socket_cookie(ctx), backend, vaddr, vport, check_first);
	*addr = backend->addr;
	*port = backend->port;
	stat_inc(stat);
	svc_stats_sock_xlated(svc->svc_id);
	return SYS_PROCEED;
}

/* Show the frontend instead of the IPv4 backend *addr:*port the socket really talks to. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx, __be32 *addr,
					    __be16 *port, __u32 stat)
{
	struct lb4_revsk_val *frontend;

#if EBPFLB_HAVE_SK_STORAGE
	if (ctx->protocol == IPPROTO_TCP) {
		struct lb4_sock_rev *rev;

		rev = lb4_sockrev_lookup(ctx->sk, *addr, *port);
		if (rev) {
			*addr = rev->frontend_addr;
			*port = rev->frontend_port;
			stat_inc(stat);
			return;
		}
		/* Else a socket connected before the agent switched to socket storage. */
	}
#endif
	frontend = lb4_revsk_lookup(bpf_get_socket_cookie(ctx), *addr, *port);
	if (!frontend)
		return;
	*addr = frontend->addr;
	*port = frontend->port;
	stat_inc(stat);
}

/* Whether an IPv6 address is IPv4-mapped (::ffff:a.b.c.d; the IPv4 address in addr[3]). */
static __always_inline bool ipv6_is_v4_mapped(const __be32 addr[4])
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0x0000ffff);
}

/* The destination of an IPv6 sock_addr program's socket, copied out of its context. */
static __always_inline void sock6_addr(const struct bpf_sock_addr *ctx, __be32 addr[4])
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
}

/* Translate an IPv6 socket's destination if it is a frontend: an IPv6 one from
 * ebpflb_svc6, an IPv4-mapped one from the IPv4 tables (then the backend is written back
 * IPv4-mapped). */
static __always_inline enum sys_verdict sock6_xlate_fwd(struct bpf_sock_addr *ctx, __u32 hash,
							__u32 stat, bool check_first)
{
	__be16 vport = (__be16)ctx->user_port;
	struct lb_svc_val *svc;
	struct lb6_backend *backend;
	__be32 vaddr[4];
	__u32 backend_id;
	__u64 client;

	sock6_addr(ctx, vaddr);
	if (ipv6_is_v4_mapped(vaddr)) {
		__be32 addr4 = vaddr[3];
		__be16 port4 = vport;
		enum sys_verdict verdict;

		verdict = sock4_xlate_fwd(ctx, &addr4, &port4, hash, stat, check_first);
		if (addr4 != vaddr[3] || port4 != vport) {
			ctx->user_ip6[3] = addr4;
			ctx->user_port = (__u32)port4;
		}
		return verdict;
	}
	if (!sock_in_scope(ctx))
		return SYS_PROCEED;
	svc = lb6_lookup_service_in_node(vaddr, vport, (__u8)ctx->protocol);
	if (!svc)
		return SYS_PROCEED;
	client = svc->flags & SVC_F_AFFINITY ? bpf_get_netns_cookie(ctx) : 0;
	backend = lb6_pick_backend(svc, hash, client, AFF_CLIENT_NETNS, &backend_id);
	if (!backend)
		return sock_refuse(svc);
#if EBPFLB_HAVE_SK_STORAGE
	if (ctx->protocol == IPPROTO_TCP)
		lb6_sockrev_store(ctx->sk, backend, vaddr, vport);
	else
#endif
		lb6_revsk_store(bpf_get_socket_cookie(ctx), backend, vaddr, vport, check_first);
	ctx->user_ip6[0] = backend->addr[0];
	ctx->user_ip6[1] = backend->addr[1];
	ctx->user_ip6[2] = backend->addr[2];
	ctx->user_ip6[3] = backend->addr[3];
	ctx->user_port = (__u32)backend->port;
	stat_inc(stat);
	svc_stats_sock_xlated(svc->svc_id);
	return SYS_PROCEED;
}

/* Show an IPv6 socket the frontend instead of its backend (IPv4-mapped ones through the
 * IPv4 entries). */
static __always_inline void sock6_xlate_rev(struct bpf_sock_addr *ctx, __u32 stat)
{
	__be16 port = (__be16)ctx->user_port;
	struct lb6_revsk_val *frontend;
	__be32 addr[4];

	sock6_addr(ctx, addr);
	if (ipv6_is_v4_mapped(addr)) {
		__be32 addr4 = addr[3];
		__be16 port4 = port;

		sock4_xlate_rev(ctx, &addr4, &port4, stat);
		if (addr4 != addr[3] || port4 != port) {
			ctx->user_ip6[3] = addr4;
			ctx->user_port = (__u32)port4;
		}
		return;
	}
#if EBPFLB_HAVE_SK_STORAGE
	if (ctx->protocol == IPPROTO_TCP) {
		struct lb6_sock_rev *rev = lb6_sockrev_lookup(ctx->sk, addr, port);

		if (rev) {
			ctx->user_ip6[0] = rev->frontend_addr[0];
			ctx->user_ip6[1] = rev->frontend_addr[1];
			ctx->user_ip6[2] = rev->frontend_addr[2];
			ctx->user_ip6[3] = rev->frontend_addr[3];
			ctx->user_port = (__u32)rev->frontend_port;
			stat_inc(stat);
			return;
		}
	}
#endif
	frontend = lb6_revsk_lookup(bpf_get_socket_cookie(ctx), addr, port);
	if (!frontend)
		return;
	ctx->user_ip6[0] = frontend->addr[0];
	ctx->user_ip6[1] = frontend->addr[1];
	ctx->user_ip6[2] = frontend->addr[2];
	ctx->user_ip6[3] = frontend->addr[3];
	ctx->user_port = (__u32)frontend->port;
	stat_inc(stat);
}

#endif /* EBPFLB_SOCK_H */
