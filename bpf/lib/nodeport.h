/* What a NodePort/LoadBalancer/external-IP packet becomes, for both families: the
 * decisions shared by the tc and XDP entry points. These functions only read and write
 * maps and return a verdict and the new header values; each hook applies them with its
 * own helpers. Both families follow the same rules (backend by Maglev slot at the flow
 * hash, remembered in conntrack; SNAT to the egress interface's node address for a
 * remote backend under externalTrafficPolicy=Cluster; source ranges; session affinity by
 * source; ICMP errors about a flow translated as the flow is); service ids, the slot pool
 * and affinity are shared, the flows are the family's. Each IPv6 function follows its
 * IPv4 twin. A later fragment reaches these functions with its first fragment's ports
 * (lib/frag.h). */
#ifndef EBPFLB_NODEPORT_H
#define EBPFLB_NODEPORT_H

#include "conntrack.h"
#include "fib.h"
#include "hash.h"
#include "icmp.h"
#include "lb.h"
#include "nat.h"
#include "pkt.h"
#include "stats.h"

enum np_verdict {
	NP_PASS,  /* not ours: leave the packet alone */
	NP_DROP,  /* ours, but must not be forwarded */
	NP_XLATE, /* rewrite to *out, then let it continue */
	NP_REJECT, /* ours, no endpoint anywhere: answer it (lib/answer.h) or drop it */
};

/* Whether a LoadBalancer frontend with source ranges accepts this source. */
static __always_inline bool src_range4_allowed(__u32 svc_id, __be32 saddr)
{
	struct src_range4_key key = {
		.prefixlen = SRC_RANGE_EXACT_PREFIXLEN,
		.svc_id = bpf_htonl(svc_id),
		.addr = saddr,
	};

	return ebpflb_srcrng4.lookup(&key) != NULL;
}

/* Whether an IPv6 LoadBalancer frontend with source ranges accepts this source. */
static __always_inline bool src_range6_allowed(__u32 svc_id, const __be32 saddr[4])
{
	struct src_range6_key key = {
		.prefixlen = SRC_RANGE6_EXACT_PREFIXLEN,
		.svc_id = bpf_htonl(svc_id),
		.addr = {saddr[0], saddr[1], saddr[2], saddr[3]},
	};

	return ebpflb_srcrng6.lookup(&key) != NULL;
}

/* The frontend a packet is for, or NULL when it is for none this path translates. On a
 * node's interface: NodePort, LoadBalancer and external-IP frontends (SVC_F_EXTERNAL), with
 * externalTrafficPolicy's backends. On a pod's (EBPFLB_POD_PATH): every frontend, ClusterIPs
 * included, as an in-node client sees it (socket-LB's view: lb4_lookup_service_in_node). */
static __always_inline struct lb_svc_val *np4_lookup_service(const struct flow4 *flow)
{
	struct lb_svc_val *svc;

	if (EBPFLB_POD_PATH)
		return lb4_lookup_service_in_node(flow->daddr, flow->dport, flow->proto);
	svc = lb4_lookup_service(flow->daddr, flow->dport, flow->proto, LB_SCOPE_EXTERNAL);
	return svc && (svc->flags & SVC_F_EXTERNAL) ? svc : NULL;
}

/* np4_lookup_service's twin. */
static __always_inline struct lb_svc_val *np6_lookup_service(const struct flow6 *flow)
{
	struct lb_svc_val *svc;

	if (EBPFLB_POD_PATH)
		return lb6_lookup_service_in_node(flow->daddr, flow->dport, flow->proto);
	svc = lb6_lookup_service(flow->daddr, flow->dport, flow->proto, LB_SCOPE_EXTERNAL);
	return svc && (svc->flags & SVC_F_EXTERNAL) ? svc : NULL;
}

/* Whether a new flow's source becomes a node address. On a node's interface: for a remote
 * backend under externalTrafficPolicy=Cluster (kube-proxy's KUBE-MARK-MASQ), so its reply
 * comes back through this node. On a pod's: only when the backend is the client itself
 * (hairpin), which would otherwise answer itself; other pods see the client pod's address,
 * as with kube-proxy. */
static __always_inline bool np_snat(const struct lb_svc_val *svc, __u32 backend_flags,
				    bool hairpin)
{
	if (EBPFLB_POD_PATH)
		return hairpin;
	return !(svc->flags & SVC_F_ETP_LOCAL) && !(backend_flags & BE_F_LOCAL);
}

/* Whether a packet for a frontend with no usable backend is answered (TCP RST, ICMP port
 * unreachable) rather than dropped. On a node's interface: when the whole service has no
 * endpoint (SVC_F_REJECT; an eTP=Local node with endpoints elsewhere drops, as kube-proxy).
 * On a pod's: always, as socket-LB refuses such a connect() for an in-node client. */
static __always_inline bool np_reject(const struct lb_svc_val *svc)
{
	return EBPFLB_POD_PATH || (svc->flags & SVC_F_REJECT);
}

/* A backend's SYN-ACK answers a SYN. When the flow a reply translation belongs to is
 * ending (FIN or RST seen) or gone, that SYN was another connection's on the same addresses
 * and ports (the client reusing its port to reach the backend directly, untranslated): the
 * translation is stale, and is removed before it rewrites that connection's replies. */
static __always_inline bool rnat4_stale(const struct pkt4 *pkt, const struct rnat4_val *rnat,
					__u64 now)
{
	struct flow4 orig = {};
	struct ct4_entry *ct;

	if (pkt->flow.proto != IPPROTO_TCP || !(pkt->tcp_flags & TCP_FLAG_SYN))
		return false;
	rnat4_orig(&orig, rnat, pkt->flow.proto);
	ct = ct4_get(&orig);
	if (ct && ct->expires >= now && !(ct->flags & CT_MASK_ENDING))
		return false;
	ebpflb_rnat4.delete((struct flow4 *)&pkt->flow);
	return true;
}

/* rnat4_stale's twin. */
static __always_inline bool rnat6_stale(const struct pkt6 *pkt, const struct rnat6_val *rnat,
					__u64 now)
{
	struct flow6 orig = {};
	struct ct6_entry *ct;

	if (pkt->flow.proto != IPPROTO_TCP || !(pkt->tcp_flags & TCP_FLAG_SYN))
		return false;
	rnat6_orig(&orig, rnat, pkt->flow.proto);
	ct = ct6_get(&orig);
	if (ct && ct->expires >= now && !(ct->flags & CT_MASK_ENDING))
		return false;
	ebpflb_rnat6.delete((struct flow6 *)&pkt->flow);
	return true;
}

/* Reply direction: backend -> client, shown as frontend -> client. */
static __always_inline void np4_reply(const struct pkt4 *pkt, struct rnat4_val *rnat, __u64 now,
				      struct xlate4 *out)
{
	struct flow4 orig = {};
	struct ct4_entry *ct;

	rnat4_orig(&orig, rnat, pkt->flow.proto);
	ct = ct4_get(&orig);
	if (ct)
		rnat->expires = ct4_touch(ct, pkt, 1, now);
	else /* conntrack entry evicted: keep answering the flow as long as it talks */
		rnat->expires = now + ct_lifetime(pkt->flow.proto, CT_F_REPLY_SEEN);
	out->saddr = rnat->frontend_addr;
	out->sport = rnat->frontend_port;
	out->daddr = rnat->client_addr;
	out->dport = rnat->client_port;
	stat_inc(STAT_NP_REPLY);
}

/* np4_reply's twin. */
static __always_inline void np6_reply(const struct pkt6 *pkt, struct rnat6_val *rnat, __u64 now,
				      struct xlate6 *out)
{
	struct flow6 orig = {};
	struct ct6_entry *ct;

	rnat6_orig(&orig, rnat, pkt->flow.proto);
	ct = ct6_get(&orig);
	if (ct)
		rnat->expires = ct6_touch(ct, pkt, 1, now);
	else /* conntrack entry evicted: keep answering the flow as long as it talks */
		rnat->expires = now + ct_lifetime(pkt->flow.proto, CT_F_REPLY_SEEN);
	addr6_copy(out->saddr, rnat->frontend_addr);
	out->sport = rnat->frontend_port;
	addr6_copy(out->daddr, rnat->client_addr);
	out->dport = rnat->client_port;
	stat_inc(STAT_NP_REPLY);
}

/* Start a flow: pick the backend, decide on SNAT, reserve the reply translation. */
static __always_inline enum np_verdict np4_new_flow(void *ctx, const struct pkt4 *pkt,
						    const struct lb_svc_val *svc, __u32 ifindex,
						    __u64 now, struct ct4_entry *ct)
{
	const struct flow4 *flow = &pkt->flow;
	__u32 hash = flow4_hash(flow);
	struct lb4_backend *backend;
	enum snat_result reserved;
	__be32 *nat_addr;
	__u64 deadline;

	backend = lb4_pick_backend(svc, hash, flow->saddr, AFF_CLIENT_ADDR4, &ct->backend_id);
	if (!backend) {
		/* A rejected packet is counted where the answer is built (tc): XDP passes it
		 * there, and counting here would count it in both. */
		if (np_reject(svc))
			return NP_REJECT;
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(svc->svc_id);
		return NP_DROP;
	}
	ct->backend_addr = backend->addr;
	ct->backend_port = backend->port;
	ct->svc_id = svc->svc_id;
	ct->flags = ct_next_flags(0, pkt->tcp_flags, 0);
	if (np_snat(svc, backend->flags, backend->addr == flow->saddr)) {
		nat_addr = snat4_source(ctx, ifindex, flow->proto, flow->saddr, backend->addr);
		if (!nat_addr) {
			stat_inc(STAT_SNAT_NO_ADDR);
			return NP_DROP;
		}
		ct->flags |= CT_F_SNAT;
		ct->nat_addr = *nat_addr;
	}
	deadline = now + ct_lifetime(flow->proto, ct->flags);
	ct->expires = deadline;
	ct->packets = 1;
	ct->bytes = pkt->len;
	if (ct->flags & CT_F_SNAT) {
		reserved = snat4_reserve(ct, flow, hash, deadline);
		if (reserved != SNAT_OK) {
			stat_inc(reserved == SNAT_MAP_FULL ? STAT_RNAT_STORE_FAIL : STAT_SNAT_EXHAUSTED);
			return NP_DROP;
		}
	} else if (rnat4_store_local(ct, flow, deadline) != 0) {
		stat_inc(STAT_RNAT_STORE_FAIL);
		return NP_DROP;
	}
	if (ct4_store(flow, ct) != 0) {
		stat_inc(STAT_CT_CREATE_FAIL);
		return NP_DROP;
	}
	stat_inc(STAT_NP_NEW_FLOW);
	svc_stats_np_flow(svc->svc_id);
	return NP_XLATE;
}

/* Start an IPv6 flow: pick the backend, decide on SNAT, reserve the reply translation. */
static __always_inline enum np_verdict np6_new_flow(void *ctx, const struct pkt6 *pkt,
						    const struct lb_svc_val *svc, __u32 ifindex,
						    __u64 now, struct ct6_entry *ct)
{
	const struct flow6 *flow = &pkt->flow;
	__u32 hash = flow6_hash(flow);
	struct lb6_backend *backend;
	enum snat_result reserved;
	struct addr6 *nat_addr;
	__u64 deadline;

	backend = lb6_pick_backend(svc, hash, addr6_fold(flow->saddr), AFF_CLIENT_ADDR6,
				   &ct->backend_id);
	if (!backend) {
		if (np_reject(svc))
			return NP_REJECT; /* counted where the answer is built (tc) */
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(svc->svc_id);
		return NP_DROP;
	}
	addr6_copy(ct->backend_addr, backend->addr);
	ct->backend_port = backend->port;
	ct->svc_id = svc->svc_id;
	ct->flags = ct_next_flags(0, pkt->tcp_flags, 0);
	if (np_snat(svc, backend->flags, addr6_equal(backend->addr, flow->saddr))) {
		nat_addr = snat6_source(ctx, ifindex, flow->proto, flow->saddr, backend->addr);
		if (!nat_addr) {
			stat_inc(STAT_SNAT_NO_ADDR);
			return NP_DROP;
		}
		ct->flags |= CT_F_SNAT;
		addr6_copy(ct->nat_addr, nat_addr->addr);
	}
	deadline = now + ct_lifetime(flow->proto, ct->flags);
	ct->expires = deadline;
	ct->packets = 1;
	ct->bytes = pkt->len;
	if (ct->flags & CT_F_SNAT) {
		reserved = snat6_reserve(ct, flow, hash, deadline);
		if (reserved != SNAT_OK) {
			stat_inc(reserved == SNAT_MAP_FULL ? STAT_RNAT_STORE_FAIL : STAT_SNAT_EXHAUSTED);
			return NP_DROP;
		}
	} else if (rnat6_store_local(ct, flow, deadline) != 0) {
		stat_inc(STAT_RNAT_STORE_FAIL);
		return NP_DROP;
	}
	if (ct6_store(flow, ct) != 0) {
		stat_inc(STAT_CT_CREATE_FAIL);
		return NP_DROP;
	}
	stat_inc(STAT_NP_NEW_FLOW);
	svc_stats_np_flow(svc->svc_id);
	return NP_XLATE;
}

/* Record a packet of a known flow and keep its reply translation alive (one lookup).
 * False when a SNATed flow's port reservation is no longer its own: the flow starts over. */
static __always_inline bool np4_flow_continue(struct ct4_entry *ct, const struct pkt4 *pkt,
					      __u64 now)
{
	struct flow4 key = {};
	struct rnat4_val *rnat;
	bool owned;

	rnat4_key(&key, ct, &pkt->flow);
	rnat = ebpflb_rnat4.lookup(&key);
	owned = rnat && rnat4_owned_by(rnat, &pkt->flow);
	if (!owned && (ct->flags & CT_F_SNAT))
		return false;
	ct4_touch(ct, pkt, 0, now);
	if (owned)
		rnat->expires = ct->expires;
	return true;
}

/* A packet of a known IPv6 flow; false when a SNATed flow's port reservation is no longer
 * its own (the flow starts over). */
static __always_inline bool np6_flow_continue(struct ct6_entry *ct, const struct pkt6 *pkt,
					      __u64 now)
{
	struct flow6 key = {};
	struct rnat6_val *rnat;
	bool owned;

	rnat6_key(&key, ct, &pkt->flow);
	rnat = ebpflb_rnat6.lookup(&key);
	owned = rnat && rnat6_owned_by(rnat, &pkt->flow);
	if (!owned && (ct->flags & CT_F_SNAT))
		return false;
	ct6_touch(ct, pkt, 0, now);
	if (owned)
		rnat->expires = ct->expires;
	return true;
}

/* Ingress on a node interface (`ctx`: the skb or the xdp_md). */
static __always_inline enum np_verdict np4_ingress(void *ctx, const struct pkt4 *pkt,
						   __u32 ifindex, struct xlate4 *out)
{
	const struct flow4 *flow = &pkt->flow;
	struct ct4_entry new_ct = {}, *ct;
	struct lb_svc_val *svc;
	struct rnat4_val *rnat;
	enum np_verdict verdict;
	__u64 now;

	now = bpf_ktime_get_ns();
	/* Replies to SNATed flows come back to a port of the SNAT range: only those packets
	 * pay for the reply-translation lookup. */
	if (bpf_ntohs(flow->dport) >= EBPFLB_SNAT_PORT_MIN &&
	    bpf_ntohs(flow->dport) <= EBPFLB_SNAT_PORT_MAX) {
		rnat = ebpflb_rnat4.lookup((struct flow4 *)flow);
		if (rnat && (rnat->flags & RNAT_F_SNAT)) {
			np4_reply(pkt, rnat, now, out);
			return NP_XLATE;
		}
	}
	svc = np4_lookup_service(flow);
	if (!svc)
		return NP_PASS;
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !src_range4_allowed(svc->svc_id, flow->saddr)) {
		stat_inc(STAT_SRC_RANGE_DROP);
		return NP_DROP;
	}
	ct = ct4_lookup(flow, pkt, now);
	if (ct && np4_flow_continue(ct, pkt, now)) {
		stat_inc(STAT_NP_FWD);
	} else {
		verdict = np4_new_flow(ctx, pkt, svc, ifindex, now, &new_ct);
		out->svc_id = svc->svc_id; /* NP_REJECT: the tc hook counts the refusal */
		if (verdict != NP_XLATE)
			return verdict;
		ct = &new_ct;
	}
	out->daddr = ct->backend_addr;
	out->dport = ct->backend_port;
	out->saddr = (ct->flags & CT_F_SNAT) ? ct->nat_addr : flow->saddr;
	out->sport = (ct->flags & CT_F_SNAT) ? ct->nat_port : flow->sport;
	out->svc_id = svc->svc_id; /* the hook counts the packet once it is translated */
	return NP_XLATE;
}

/* np4_ingress' twin. */
static __always_inline enum np_verdict np6_ingress(void *ctx, const struct pkt6 *pkt,
						   __u32 ifindex, struct xlate6 *out)
{
	const struct flow6 *flow = &pkt->flow;
	struct ct6_entry new_ct = {}, *ct;
	struct lb_svc_val *svc;
	struct rnat6_val *rnat;
	enum np_verdict verdict;
	__u64 now;

	now = bpf_ktime_get_ns();
	if (bpf_ntohs(flow->dport) >= EBPFLB_SNAT_PORT_MIN &&
	    bpf_ntohs(flow->dport) <= EBPFLB_SNAT_PORT_MAX) {
		rnat = ebpflb_rnat6.lookup((struct flow6 *)flow);
		if (rnat && (rnat->flags & RNAT_F_SNAT)) {
			np6_reply(pkt, rnat, now, out);
			return NP_XLATE;
		}
	}
	svc = np6_lookup_service(flow);
	if (!svc)
		return NP_PASS;
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !src_range6_allowed(svc->svc_id, flow->saddr)) {
		stat_inc(STAT_SRC_RANGE_DROP);
		return NP_DROP;
	}
	ct = ct6_lookup(flow, pkt, now);
	if (ct && np6_flow_continue(ct, pkt, now)) {
		stat_inc(STAT_NP_FWD);
	} else {
		verdict = np6_new_flow(ctx, pkt, svc, ifindex, now, &new_ct);
		out->svc_id = svc->svc_id;
		if (verdict != NP_XLATE)
			return verdict;
		ct = &new_ct;
	}
	addr6_copy(out->daddr, ct->backend_addr);
	out->dport = ct->backend_port;
	if (ct->flags & CT_F_SNAT) {
		addr6_copy(out->saddr, ct->nat_addr);
		out->sport = ct->nat_port;
	} else {
		addr6_copy(out->saddr, flow->saddr);
		out->sport = flow->sport;
	}
	out->svc_id = svc->svc_id;
	return NP_XLATE;
}

/* Egress on a node interface: replies of flows DNATed to a local backend. */
static __always_inline enum np_verdict np4_egress(const struct pkt4 *pkt, struct xlate4 *out)
{
	struct rnat4_val *rnat;
	__u64 now;

	rnat = ebpflb_rnat4.lookup((struct flow4 *)&pkt->flow);
	if (!rnat || (rnat->flags & RNAT_F_SNAT))
		return NP_PASS; /* every packet into a pod comes here: no clock read for those */
	now = bpf_ktime_get_ns();
	if (rnat4_stale(pkt, rnat, now))
		return NP_PASS;
	np4_reply(pkt, rnat, now, out);
	out->daddr = pkt->flow.daddr; /* the client, unchanged */
	out->dport = pkt->flow.dport;
	return NP_XLATE;
}

/* Egress on a node interface: replies of IPv6 flows DNATed to a local backend. */
static __always_inline enum np_verdict np6_egress(const struct pkt6 *pkt, struct xlate6 *out)
{
	struct rnat6_val *rnat;
	__u64 now;

	rnat = ebpflb_rnat6.lookup((struct flow6 *)&pkt->flow);
	if (!rnat || (rnat->flags & RNAT_F_SNAT))
		return NP_PASS; /* every packet into a pod comes here: no clock read for those */
	now = bpf_ktime_get_ns();
	if (rnat6_stale(pkt, rnat, now))
		return NP_PASS;
	np6_reply(pkt, rnat, now, out);
	addr6_copy(out->daddr, pkt->flow.daddr); /* the client, unchanged */
	out->dport = pkt->flow.dport;
	return NP_XLATE;
}

/* The reply tuple of the flow an ICMP error's embedded packet belongs to, whichever way
 * that packet went: the embedded tuple reversed. Towards a backend, it is the key of the
 * reply translation (ebpflb_rnat4); towards the client, of the flow's conntrack entry. */
static __always_inline void icmp4_flow_key(struct flow4 *key, const struct flow4 *inner)
{
	key->saddr = inner->daddr;
	key->daddr = inner->saddr;
	key->sport = inner->dport;
	key->dport = inner->sport;
	key->proto = inner->proto;
}

/* icmp4_flow_key's twin. */
static __always_inline void icmp6_flow_key(struct flow6 *key, const struct flow6 *inner)
{
	addr6_copy(key->saddr, inner->daddr);
	addr6_copy(key->daddr, inner->saddr);
	key->sport = inner->dport;
	key->dport = inner->sport;
	key->proto = inner->proto;
}

/* An ICMP error arriving on a node interface about a flow this node translates, sent (as
 * errors are) to the source of the packet it is about:
 * - to a SNAT source, about a packet of the client's sent on to the backend (a router on
 *   the way, or the backend itself, answering it): shown to the client as about its own
 *   packet to the frontend, and from the frontend when the backend itself answered (as
 *   the backend's replies are);
 * - to a frontend, about a reply this node sent as the frontend (a router on the client's
 *   side): shown to the backend as about its own reply.
 * NP_XLATE with the outer header's new addresses in *out and err->inner turned into the
 * embedded packet's new tuple (the rewrite reads the old one from the packet); NP_PASS when
 * it is about no flow of ours. */
static __always_inline enum np_verdict np4_icmp_ingress(const struct pkt4 *pkt,
							struct icmp4_err *err,
							struct xlate4 *out)
{
	struct flow4 key = {};
	struct rnat4_val *rnat;
	struct ct4_entry *ct;

	if (pkt->flow.daddr != err->inner.saddr)
		return NP_PASS;
	icmp4_flow_key(&key, &err->inner);
	rnat = ebpflb_rnat4.lookup(&key);
	if (rnat && (rnat->flags & RNAT_F_SNAT)) {
		out->daddr = rnat->client_addr;
		out->saddr = pkt->flow.saddr == key.saddr ? rnat->frontend_addr : pkt->flow.saddr;
		err->inner.saddr = rnat->client_addr;
		err->inner.sport = rnat->client_port;
		err->inner.daddr = rnat->frontend_addr;
		err->inner.dport = rnat->frontend_port;
		return NP_XLATE;
	}
	ct = ct4_get(&key);
	if (!ct || ct->expires < bpf_ktime_get_ns())
		return NP_PASS;
	err->inner.saddr = ct->backend_addr;
	err->inner.sport = ct->backend_port;
	err->inner.daddr = (ct->flags & CT_F_SNAT) ? ct->nat_addr : key.saddr;
	err->inner.dport = (ct->flags & CT_F_SNAT) ? ct->nat_port : key.sport;
	out->daddr = ct->backend_addr;
	out->saddr = pkt->flow.saddr;
	return NP_XLATE;
}

/* np4_icmp_ingress' twin. */
static __always_inline enum np_verdict np6_icmp_ingress(const struct pkt6 *pkt,
							struct icmp6_err *err,
							struct xlate6 *out)
{
	struct flow6 key = {};
	struct rnat6_val *rnat;
	struct ct6_entry *ct;

	if (!addr6_equal(pkt->flow.daddr, err->inner.saddr))
		return NP_PASS;
	icmp6_flow_key(&key, &err->inner);
	rnat = ebpflb_rnat6.lookup(&key);
	if (rnat && (rnat->flags & RNAT_F_SNAT)) {
		addr6_copy(out->daddr, rnat->client_addr);
		if (addr6_equal(pkt->flow.saddr, key.saddr)) /* the backend itself answered */
			addr6_copy(out->saddr, rnat->frontend_addr);
		else
			addr6_copy(out->saddr, pkt->flow.saddr);
		addr6_copy(err->inner.saddr, rnat->client_addr);
		err->inner.sport = rnat->client_port;
		addr6_copy(err->inner.daddr, rnat->frontend_addr);
		err->inner.dport = rnat->frontend_port;
		return NP_XLATE;
	}
	ct = ct6_get(&key);
	if (!ct || ct->expires < bpf_ktime_get_ns())
		return NP_PASS;
	addr6_copy(err->inner.saddr, ct->backend_addr);
	err->inner.sport = ct->backend_port;
	if (ct->flags & CT_F_SNAT) {
		addr6_copy(err->inner.daddr, ct->nat_addr);
		err->inner.dport = ct->nat_port;
	} else {
		addr6_copy(err->inner.daddr, key.saddr);
		err->inner.dport = key.sport;
	}
	addr6_copy(out->daddr, ct->backend_addr);
	addr6_copy(out->saddr, pkt->flow.saddr);
	return NP_XLATE;
}

/* An ICMP error leaving a node interface towards a client about the client's packet to a
 * local backend (the backend answering it, or this node's own forwarding path: too big
 * for the next hop, handed the packet DNATed): shown as about the client's packet to the
 * frontend, from the frontend. NP_PASS when it is about no flow of ours. */
static __always_inline enum np_verdict np4_icmp_egress(const struct pkt4 *pkt,
						       struct icmp4_err *err,
						       struct xlate4 *out)
{
	struct flow4 key = {};
	struct rnat4_val *rnat;

	if (pkt->flow.daddr != err->inner.saddr)
		return NP_PASS;
	icmp4_flow_key(&key, &err->inner);
	rnat = ebpflb_rnat4.lookup(&key);
	if (!rnat || (rnat->flags & RNAT_F_SNAT))
		return NP_PASS;
	err->inner.daddr = rnat->frontend_addr;
	err->inner.dport = rnat->frontend_port;
	out->saddr = rnat->frontend_addr;
	out->daddr = pkt->flow.daddr;
	return NP_XLATE;
}

/* np4_icmp_egress' twin. */
static __always_inline enum np_verdict np6_icmp_egress(const struct pkt6 *pkt,
						       struct icmp6_err *err,
						       struct xlate6 *out)
{
	struct flow6 key = {};
	struct rnat6_val *rnat;

	if (!addr6_equal(pkt->flow.daddr, err->inner.saddr))
		return NP_PASS;
	icmp6_flow_key(&key, &err->inner);
	rnat = ebpflb_rnat6.lookup(&key);
	if (!rnat || (rnat->flags & RNAT_F_SNAT))
		return NP_PASS;
	addr6_copy(err->inner.daddr, rnat->frontend_addr);
	err->inner.dport = rnat->frontend_port;
	addr6_copy(out->saddr, rnat->frontend_addr);
	addr6_copy(out->daddr, pkt->flow.daddr);
	return NP_XLATE;
}

#endif /* EBPFLB_NODEPORT_H */
