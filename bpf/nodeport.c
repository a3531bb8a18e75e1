/* NodePort, LoadBalancer and external-IP load balancing on the node's interfaces (tc),
 * for IPv4 and IPv6 (one program each way; the Ethernet type picks the family's path).
 *
 * ingress (ebpflb_np_in): a reply to a SNATed flow is translated back to the client's view;
 *   a packet to a frontend of one of those types is DNATed to a backend picked from the
 *   service's Maglev table by a hash of its 5-tuple (remembered in conntrack), and SNATed
 *   to the egress interface's node address when the backend runs on another node and
 *   externalTrafficPolicy is Cluster (kube-proxy's KUBE-MARK-MASQ); the decisions are
 *   lib/nodeport.h's. Packets whose source became a node address are forwarded by the
 *   program (lib/fib.h), routed before they are translated, so one too big for the next
 *   hop is answered with fragmentation needed / packet too big about the packet as its
 *   sender sent it (lib/answer.h); DNAT-only packets go on to the stack. An ICMP error
 *   about a translated flow is translated as the flow is (lib/icmp.h); IP fragments
 *   follow their datagram's first fragment (lib/frag.h).
 * egress (ebpflb_np_out): a reply from a local backend (no SNAT) gets the frontend as its
 *   source again, and so does an ICMP error about such a flow (the backend's own, or the
 *   forwarding path's about a DNATed packet that did not fit); the fragments the stack
 *   made of a packet left to it get their translated source.
 *
 * Return codes: TC_ACT_OK lets the (possibly rewritten) packet continue; TC_ACT_SHOT drops
 * it (source outside loadBalancerSourceRanges, no usable backend, no SNAT port, no route);
 * a packet to a service with no endpoint at all is answered instead
 * (TCP RST, ICMP or ICMPv6 port unreachable: lib/answer.h);
 * TC_ACT_REDIRECT (from bpf_redirect*) sends it out of the chosen interface.
 */
#include <uapi/linux/bpf.h>

#include "lib/answer.h"
#include "lib/fib.h"
#include "lib/frag.h"
#include "lib/icmp.h"
#include "lib/nodeport.h"

/* Each family's path, and its ICMP error path, is a function of its own (a BPF-to-BPF
 * call): each gets a stack frame of its own, where inlined into one program their locals
 * together passed the 512-byte stack limit. A family path that meets an ICMP message
 * returns NP_RC_ICMP and the entry point calls the ICMP path, so no call chain holds two
 * large frames. */
#define NP_RC_ICMP 0x100 /* not a TC_ACT_*: "an ICMP message, for the ICMP path" */

/* The same programs serve pods' interfaces, compiled with EBPFLB_POD_PATH=1 (lib/consts.h):
 * ingress there is what a pod sends, so ClusterIP packets are translated per packet (for
 * clients no socket hook saw: sidecars under --socket-lb=hostns-only, VMs, routed traffic),
 * and egress is what reaches the pod, so its replies get the frontend back as their source.
 * Each variant's programs have names of their own: pins and tc filters tell them apart. */
#if EBPFLB_POD_PATH
#define NP_ENTRY_IN ebpflb_pod_in
#define NP_ENTRY_OUT ebpflb_pod_out
#else
#define NP_ENTRY_IN ebpflb_np_in
#define NP_ENTRY_OUT ebpflb_np_out
#endif
#define EBPFLB_NOINLINE __always_inline

/* Forward a packet whose source becomes a node address: routed first, then translated,
 * its TTL decremented, and sent out of the route's interface. */
static __always_inline int np4_forward(struct __sk_buff *skb, const struct pkt4 *pkt,
				       const struct xlate4 *out)
{
	struct bpf_fib_lookup fib = {};
	__u32 mtu = 0;
	int rc;

	switch (tc_route4(skb, pkt, out->saddr, out->daddr, &fib, &rc, &mtu)) {
	case FIB_SEND:
		break;
	case FIB_TOO_BIG:
		if (tc_may_fragment4(skb, pkt))
			return tc_fragment4(skb, pkt, out);
		return tc_too_big4(skb, pkt, mtu);
	default:
		return TC_ACT_SHOT;
	}
	if (pkt4_xlate_skb(skb, pkt, out) < 0)
		return TC_ACT_SHOT;
	svc_stats_np_packet(out->svc_id, pkt->len);
	if (tc_dec_ttl(skb, pkt) < 0)
		return TC_ACT_SHOT;
	return tc_redirect_routed(skb, rc, &fib);
}

/* np4_forward's twin. */
static __always_inline int np6_forward(struct __sk_buff *skb, const struct pkt6 *pkt,
				       const struct xlate6 *out)
{
	struct bpf_fib_lookup fib = {};
	__u32 mtu = 0;
	int rc;

	switch (tc_route6(skb, pkt, out->saddr, out->daddr, &fib, &rc, &mtu)) {
	case FIB_SEND:
		break;
	case FIB_TOO_BIG:
		return tc_too_big6(skb, pkt, mtu);
	default:
		return TC_ACT_SHOT;
	}
	if (pkt6_xlate_skb(skb, pkt, out) < 0)
		return TC_ACT_SHOT;
	svc_stats_np_packet(out->svc_id, pkt->len);
	if (tc_dec_hop_limit(skb, pkt) < 0)
		return TC_ACT_SHOT;
	return tc_redirect_routed(skb, rc, &fib);
}

/* An ICMP error arriving about a translated flow, translated; forwarded here when it now
 * comes from a node address. */
static EBPFLB_NOINLINE int np4_icmp_in(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct icmp4_work *w = icmp_work(sizeof(struct icmp4_work));

	if (!w || pkt4_parse(data, data_end, skb->len, &w->pkt) != PKT_ICMP ||
	    icmp4_err_parse(skb, &w->pkt, &w->err) != PKT_OK ||
	    np4_icmp_ingress(&w->pkt, &w->err, &w->out) != NP_XLATE)
		return TC_ACT_OK;
	if (icmp4_err_xlate(skb, &w->pkt, &w->err, w->out.saddr, w->out.daddr, &w->err.inner,
			    &w->copies) < 0)
		return TC_ACT_SHOT;
	stat_inc(STAT_ICMP_XLATED);
	if (w->out.saddr != w->pkt.flow.saddr)
		return tc_forward4(skb, &w->pkt, w->out.saddr, w->out.daddr);
	return TC_ACT_OK;
}

/* np4_icmp_in's twin. */
static EBPFLB_NOINLINE int np6_icmp_in(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct icmp6_work *w = icmp_work(sizeof(struct icmp6_work));

	if (!w || pkt6_parse(data, data_end, skb->len, &w->pkt) != PKT_ICMP ||
	    icmp6_err_parse(skb, &w->pkt, &w->err) != PKT_OK ||
	    np6_icmp_ingress(&w->pkt, &w->err, &w->out) != NP_XLATE)
		return TC_ACT_OK;
	if (icmp6_err_xlate(skb, &w->pkt, &w->err, w->out.saddr, w->out.daddr, &w->err.inner,
			    &w->copies) < 0)
		return TC_ACT_SHOT;
	stat_inc(STAT_ICMP_XLATED);
	if (!addr6_equal(w->out.saddr, w->pkt.flow.saddr))
		return tc_forward6(skb, &w->pkt, w->out.saddr, w->out.daddr);
	return TC_ACT_OK;
}

static EBPFLB_NOINLINE int np4_in(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct xlate4 out = {};
	struct pkt4 pkt = {};

	switch (pkt4_parse(data, data_end, skb->len, &pkt)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return NP_RC_ICMP;
	default:
		return TC_ACT_OK;
	}
	if (pkt.frag == FRAG_LATER && !frag4_recall(&pkt))
		return TC_ACT_OK;
	switch (np4_ingress(skb, &pkt, skb->ifindex, &out)) {
	case NP_DROP:
		return TC_ACT_SHOT;
	case NP_REJECT:
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(out.svc_id);
		if (pkt.flow.proto == IPPROTO_TCP)
			return tc_reject4_tcp(skb, &pkt);
		return tc_reject4_udp(skb, &pkt);
	case NP_XLATE:
		if (pkt.frag != FRAG_NONE) {
			frag4_remember(&pkt);
			stat_inc(STAT_FRAGMENT);
		}
		/* The source becomes a node address (SNAT, or the frontend of a reply). */
		if (out.saddr != pkt.flow.saddr)
			return np4_forward(skb, &pkt, &out);
		if (pkt4_xlate_skb(skb, &pkt, &out) < 0)
			return TC_ACT_SHOT;
		svc_stats_np_packet(out.svc_id, pkt.len);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

static EBPFLB_NOINLINE int np6_in(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct xlate6 out = {};
	struct pkt6 pkt = {};

	switch (pkt6_parse(data, data_end, skb->len, &pkt)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return NP_RC_ICMP;
	case PKT_EXT_HEADERS:
		stat_inc(STAT_NP6_EXT_HEADER);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
	if (pkt.frag == FRAG_LATER && !frag6_recall(&pkt))
		return TC_ACT_OK;
	switch (np6_ingress(skb, &pkt, skb->ifindex, &out)) {
	case NP_DROP:
		return TC_ACT_SHOT;
	case NP_REJECT:
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(out.svc_id);
		return tc_reject6(skb, &pkt);
	case NP_XLATE:
		if (pkt.frag != FRAG_NONE) {
			frag6_remember(&pkt);
			stat_inc(STAT_FRAGMENT);
		}
		if (!addr6_equal(out.saddr, pkt.flow.saddr))
			return np6_forward(skb, &pkt, &out);
		if (pkt6_xlate_skb(skb, &pkt, &out) < 0)
			return TC_ACT_SHOT;
		svc_stats_np_packet(out.svc_id, pkt.len);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

int NP_ENTRY_IN(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	int rc;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		pkt_pull_headers(skb, PKT6_PULL_LEN);
		rc = np6_in(skb);
		return rc == NP_RC_ICMP ? np6_icmp_in(skb) : rc;
	}
	pkt_pull_headers(skb, PKT4_PULL_LEN);
	rc = np4_in(skb);
	return rc == NP_RC_ICMP ? np4_icmp_in(skb) : rc;
}

/* An ICMP error leaving about a flow to a local backend, translated. */
static EBPFLB_NOINLINE int np4_icmp_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct icmp4_work *w = icmp_work(sizeof(struct icmp4_work));

	if (!w || pkt4_parse(data, data_end, skb->len, &w->pkt) != PKT_ICMP ||
	    icmp4_err_parse(skb, &w->pkt, &w->err) != PKT_OK ||
	    np4_icmp_egress(&w->pkt, &w->err, &w->out) != NP_XLATE)
		return TC_ACT_OK;
	if (icmp4_err_xlate(skb, &w->pkt, &w->err, w->out.saddr, w->out.daddr, &w->err.inner,
			    &w->copies) < 0)
		return TC_ACT_SHOT;
	stat_inc(STAT_ICMP_XLATED);
	return TC_ACT_OK;
}

/* np4_icmp_out's twin. */
static EBPFLB_NOINLINE int np6_icmp_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct icmp6_work *w = icmp_work(sizeof(struct icmp6_work));

	if (!w || pkt6_parse(data, data_end, skb->len, &w->pkt) != PKT_ICMP ||
	    icmp6_err_parse(skb, &w->pkt, &w->err) != PKT_OK ||
	    np6_icmp_egress(&w->pkt, &w->err, &w->out) != NP_XLATE)
		return TC_ACT_OK;
	if (icmp6_err_xlate(skb, &w->pkt, &w->err, w->out.saddr, w->out.daddr, &w->err.inner,
			    &w->copies) < 0)
		return TC_ACT_SHOT;
	stat_inc(STAT_ICMP_XLATED);
	return TC_ACT_OK;
}

static EBPFLB_NOINLINE int np4_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct xlate4 out = {};
	struct pkt4 pkt = {};

	int rc;

	switch (pkt4_parse(data, data_end, skb->len, &pkt)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return NP_RC_ICMP;
	default:
		return TC_ACT_OK;
	}
	if (pkt.frag != FRAG_NONE && tc_fragmented4_out(skb, &pkt, &rc))
		return rc;
	if (pkt.frag == FRAG_LATER && !frag4_recall(&pkt))
		return TC_ACT_OK;
	if (np4_egress(&pkt, &out) != NP_XLATE)
		return TC_ACT_OK;
	if (pkt.frag != FRAG_NONE) {
		frag4_remember(&pkt);
		stat_inc(STAT_FRAGMENT);
	}
	return pkt4_xlate_skb(skb, &pkt, &out) < 0 ? TC_ACT_SHOT : TC_ACT_OK;
}

static EBPFLB_NOINLINE int np6_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct xlate6 out = {};
	struct pkt6 pkt = {};

	switch (pkt6_parse(data, data_end, skb->len, &pkt)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return NP_RC_ICMP;
	default:
		return TC_ACT_OK;
	}
	if (pkt.frag == FRAG_LATER && !frag6_recall(&pkt))
		return TC_ACT_OK;
	if (np6_egress(&pkt, &out) != NP_XLATE)
		return TC_ACT_OK;
	if (pkt.frag != FRAG_NONE) {
		frag6_remember(&pkt);
		stat_inc(STAT_FRAGMENT);
	}
	return pkt6_xlate_skb(skb, &pkt, &out) < 0 ? TC_ACT_SHOT : TC_ACT_OK;
}

int NP_ENTRY_OUT(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	int rc;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		pkt_pull_headers(skb, PKT6_PULL_LEN);
		rc = np6_out(skb);
		return rc == NP_RC_ICMP ? np6_icmp_out(skb) : rc;
	}
	pkt_pull_headers(skb, PKT4_PULL_LEN);
	rc = np4_out(skb);
	return rc == NP_RC_ICMP ? np4_icmp_out(skb) : rc;
}
