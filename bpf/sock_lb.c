/* Socket-LB: cgroup sock_addr programs translating a frontend (ClusterIP:port) to a backend
 * when the socket addresses it, so no packet ever carries the ClusterIP and nothing is
 * NATed per packet. Attached to a cgroup v2 directory (BPF_F_ALLOW_MULTI) by
 * ebpflb/datapath/programs/loader.py.
 *
 * Verdicts: SYS_PROCEED lets the syscall proceed (translated or not); SYS_REJECT makes it
 * fail (EPERM, or the errno set by lb_set_refused()). recvmsg and getpeername programs must
 * always proceed. Each family has its four entry points; the translation is lib/sock.h's.
 */
#include <uapi/linux/bpf.h>
#include <linux/in.h>

#include "lib/hash.h"
#include "lib/sock.h"

/* connect(): TCP and connected UDP. A uniformly random slot per connect. */
int ebpflb_connect4(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	enum sys_verdict verdict;

	verdict = sock4_xlate_fwd(ctx, &addr, &port, bpf_get_prandom_u32(), STAT_CONNECT_XLATED,
				  false);
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	return verdict;
}

/* sendmsg() with a destination (unconnected UDP). The slot is a hash of the socket
 * cookie, so all datagrams of one socket reach one backend while the table is unchanged,
 * as conntrack makes kube-proxy's DNAT sticky per flow. */
int ebpflb_sendmsg4(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	enum sys_verdict verdict;

	verdict = sock4_xlate_fwd(ctx, &addr, &port, mix64(bpf_get_socket_cookie(ctx)),
				  STAT_SENDMSG_XLATED, true);
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	return verdict;
}

/* recvmsg() on UDP: the datagram's source becomes the frontend the socket sent to. */
int ebpflb_recvmsg4(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	sock4_xlate_rev(ctx, &addr, &port, STAT_RECVMSG_XLATED);
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	return SYS_PROCEED;
}

/* getpeername(): a connected socket's peer is reported as the frontend. */
int ebpflb_getpeer4(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	sock4_xlate_rev(ctx, &addr, &port, STAT_PEER_XLATED);
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	return SYS_PROCEED;
}

/* The IPv6 twins: IPv6 frontends, and IPv4-mapped destinations of dual-stack sockets. An
 * unconnected UDP sendmsg() to an IPv4-mapped address reaches sendmsg4 instead (the
 * kernel hands it to the IPv4 path first). */
int ebpflb_connect6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_fwd(ctx, bpf_get_prandom_u32(), STAT_CONNECT_XLATED, false);
}

int ebpflb_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock6_xlate_fwd(ctx, mix64(bpf_get_socket_cookie(ctx)), STAT_SENDMSG_XLATED,
			       true);
}

int ebpflb_recvmsg6(struct bpf_sock_addr *ctx)
{
	sock6_xlate_rev(ctx, STAT_RECVMSG_XLATED);
	return SYS_PROCEED;
}

int ebpflb_getpeer6(struct bpf_sock_addr *ctx)
{
	sock6_xlate_rev(ctx, STAT_PEER_XLATED);
	return SYS_PROCEED;
}
