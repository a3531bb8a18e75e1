/* Load balancing shared by every program: frontend lookup and Maglev slot -> backend
 * selection; for the socket programs also refusal and the socket reverse entries. */
#ifndef EBPFLB_LB_H
#define EBPFLB_LB_H

#include <linux/errno.h>
#include "maps.h"
#include "stats.h"

static __always_inline struct lb_svc_val *lb4_lookup_service(__be32 addr, __be16 port,
							       __u8 proto, __u8 scope)
{
	struct lb4_svc_key key = {
		.addr = addr,
		.port = port,
		.proto = proto,
		.scope = scope,
	};

	return ebpflb_svc4.lookup(&key);
}

/* The entry an in-node client (socket-LB) uses: the external one, unless that one points
 * to an internal-scope entry (externalTrafficPolicy=Local: external traffic is limited to
 * local backends, traffic from inside the cluster is not, as with kube-proxy). A missing
 * internal entry (written just after its external one) leaves the external one in use. */
static __always_inline struct lb_svc_val *lb4_lookup_service_in_node(__be32 addr, __be16 port,
								       __u8 proto)
{
	struct lb_svc_val *svc, *internal;

	svc = lb4_lookup_service(addr, port, proto, LB_SCOPE_EXTERNAL);
	if (!svc || !(svc->flags & SVC_F_INTERNAL_SCOPE))
		return svc;
	internal = lb4_lookup_service(addr, port, proto, LB_SCOPE_INTERNAL);
	return internal ? internal : svc;
}

/* The backend with this id in the family's array (struct lb4_backend, or struct
 * lb6_backend with `v6`); NULL for an element never written or removed (all zero: an array
 * element cannot be deleted). `v6` is a constant at every call: the other branch is gone. */
static __always_inline void *lb_backend_lookup(__u32 backend_id, bool v6)
{
	if (v6) {
		struct lb6_backend *backend6 = ebpflb_be6.lookup(&backend_id);

		return backend6 && backend6->proto ? backend6 : NULL;
	}
	struct lb4_backend *backend4 = ebpflb_be4.lookup(&backend_id);

	return backend4 && backend4->proto ? backend4 : NULL;
}

/* Backend in slot (hash mod M) of the service's table, its id in *backend_id_out; NULL
 * when the service has no usable backend (table_size == 0) or, counted as
 * STAT_SLOT_MISS, when a slot or backend is missing. The slot pool is shared by both
 * families: the frontend's family says which backend array its ids index. */
static __always_inline void *lb_select_backend(const struct lb_svc_val *svc, __u32 hash,
					       __u32 *backend_id_out, bool v6)
{
	struct lb_slot_pair *pair;
	__u32 slot, pair_index, backend_id, pool_index = 0;
	void *pool, *backend;

	if (svc->table_size == 0)
		return NULL;
	slot = svc->table_off + hash % svc->table_size;
	pair_index = slot >> 1;
	pool = ebpflb_slotref.lookup(&pool_index);
	if (!pool)
		goto miss;
	pair = bpf_map_lookup_elem(pool, &pair_index);
	if (!pair)
		goto miss;
	backend_id = pair->backend_id[slot & 1];
	if (backend_id == 0)
		goto miss;
	backend = lb_backend_lookup(backend_id, v6);
	if (!backend)
		goto miss;
	*backend_id_out = backend_id;
	return backend;
miss:
	stat_inc(STAT_SLOT_MISS);
	return NULL;
}

/* The client's affinity backend if it still holds: the entry exists, its backend is still
 * one of the frontend's (ebpflb_affpair4, which also gives the timeout) and the timeout
 * has not passed since the client's last new connection. Service ids are shared by both
 * families, so the affinity maps are too. */
static __always_inline void *lb_affinity_backend(const struct aff_key *key, __u64 now,
						 __u32 *backend_id_out, bool v6)
{
	struct aff_match_key match = {};
	struct aff_val *aff;
	__u32 *timeout;
	void *backend;

	aff = ebpflb_aff4.lookup((struct aff_key *)key);
	if (!aff)
		return NULL;
	match.svc_id = key->svc_id;
	match.backend_id = aff->backend_id;
	timeout = ebpflb_affpair4.lookup(&match);
	if (!timeout || now - aff->last_used > (__u64)*timeout * EBPFLB_NSEC_PER_SEC)
		return NULL;
	backend = lb_backend_lookup(match.backend_id, v6);
	if (backend)
		*backend_id_out = match.backend_id;
	return backend;
}

/* Backend for a new connection of `client` (of the kind `netns` says, AFF_CLIENT_*):
 * with SVC_F_AFFINITY the client's affinity backend while it holds (kube-proxy's
 * `recent --rcheck --seconds`), else the Maglev slot at `hash`, remembered as the
 * client's affinity with the time of this connection (`recent --set`). */
static __always_inline void *lb_pick_backend(const struct lb_svc_val *svc, __u32 hash,
					     __u64 client, __u8 netns, __u32 *backend_id_out,
					     bool v6)
{
	struct aff_key key = {};
	struct aff_val val = {};
	void *backend;
	__u64 now;

	if (!(svc->flags & SVC_F_AFFINITY) || svc->table_size == 0)
		return lb_select_backend(svc, hash, backend_id_out, v6);
	key.client = client;
	key.svc_id = svc->svc_id;
	key.netns = netns;
	now = bpf_ktime_get_ns();
	backend = lb_affinity_backend(&key, now, backend_id_out, v6);
	if (backend)
		stat_inc(STAT_AFFINITY_HIT);
	else
		backend = lb_select_backend(svc, hash, backend_id_out, v6);
	if (!backend)
		return NULL;
	val.last_used = now;
	val.backend_id = *backend_id_out;
	ebpflb_aff4.update(&key, &val);
	return backend;
}

/* lb_pick_backend for an IPv4 frontend (its table's ids index ebpflb_be4). */
static __always_inline struct lb4_backend *lb4_pick_backend(const struct lb_svc_val *svc,
							    __u32 hash, __u64 client, __u8 netns,
							    __u32 *backend_id_out)
{
	return lb_pick_backend(svc, hash, client, netns, backend_id_out, false);
}

/* lb4_pick_backend's twin: an IPv6 frontend's table's ids index ebpflb_be6. */
static __always_inline struct lb6_backend *lb6_pick_backend(const struct lb_svc_val *svc,
							    __u32 hash, __u64 client, __u8 netns,
							    __u32 *backend_id_out)
{
	return lb_pick_backend(svc, hash, client, netns, backend_id_out, true);
}

/* IPv6 frontend lookups: lb4_lookup_service and lb4_lookup_service_in_node's twins. */
static __always_inline struct lb_svc_val *lb6_lookup_service(const __be32 addr[4],
							       __be16 port, __u8 proto,
							       __u8 scope)
{
	struct lb6_svc_key key = {
		.addr = {addr[0], addr[1], addr[2], addr[3]},
		.port = port,
		.proto = proto,
		.scope = scope,
	};

	return ebpflb_svc6.lookup(&key);
}

static __always_inline struct lb_svc_val *lb6_lookup_service_in_node(const __be32 addr[4],
								       __be16 port, __u8 proto)
{
	struct lb_svc_val *svc, *internal;

	svc = lb6_lookup_service(addr, port, proto, LB_SCOPE_EXTERNAL);
	if (!svc || !(svc->flags & SVC_F_INTERNAL_SCOPE))
		return svc;
	internal = lb6_lookup_service(addr, port, proto, LB_SCOPE_INTERNAL);
	return internal ? internal : svc;
}

/* Make the refused syscall fail with ECONNREFUSED, as kube-proxy's REJECT rule does.
 * Without bpf_set_retval (< 5.18) the kernel reports EPERM for a program returning 0. */
static __always_inline void lb_set_refused(void)
{
#if EBPFLB_HAVE_SET_RETVAL
	((long (*)(int))BPF_FUNC_set_retval)(-ECONNREFUSED);
#endif
}

/* Remember which frontend a socket's backend stands for. With `check_first`, written
 * only when missing or different, so a UDP socket's sendmsg() does not update the map per
 * datagram; connect() skips the lookup, which would miss for nearly every new socket. */
static __always_inline void lb4_revsk_store(__u64 cookie, const struct lb4_backend *backend,
					    __be32 vaddr, __be16 vport, bool check_first)
{
	struct lb4_revsk_key key = {
		.cookie = cookie,
		.addr = backend->addr,
		.port = backend->port,
	};
	struct lb4_revsk_val val = {
		.addr = vaddr,
		.port = vport,
	};
	struct lb4_revsk_val *old;

	if (check_first) {
		old = ebpflb_revsk4.lookup(&key);
		if (old && old->addr == vaddr && old->port == vport)
			return;
	}
	if (ebpflb_revsk4.update(&key, &val) != 0)
		stat_inc(STAT_REVSK_UPDATE_FAIL);
}

static __always_inline struct lb4_revsk_val *lb4_revsk_lookup(__u64 cookie, __be32 addr,
							     __be16 port)
{
	struct lb4_revsk_key key = {
		.cookie = cookie,
		.addr = addr,
		.port = port,
	};

	return ebpflb_revsk4.lookup(&key);
}

/* lb4_revsk_store's twin for IPv6 sockets (TCP and UDP alike). */
static __always_inline void lb6_revsk_store(__u64 cookie, const struct lb6_backend *backend,
					    const __be32 vaddr[4], __be16 vport, bool check_first)
{
	struct lb6_revsk_key key = {
		.cookie = cookie,
		.addr = {backend->addr[0], backend->addr[1], backend->addr[2], backend->addr[3]},
		.port = backend->port,
	};
	struct lb6_revsk_val val = {
		.addr = {vaddr[0], vaddr[1], vaddr[2], vaddr[3]},
		.port = vport,
	};
	struct lb6_revsk_val *old;

	if (check_first) {
		old = ebpflb_revsk6.lookup(&key);
		if (old && old->port == vport && old->addr[0] == vaddr[0] &&
		    old->addr[1] == vaddr[1] && old->addr[2] == vaddr[2] && old->addr[3] == vaddr[3])
			return;
	}
	if (ebpflb_revsk6.update(&key, &val) != 0)
		stat_inc(STAT_REVSK_UPDATE_FAIL);
}

static __always_inline struct lb6_revsk_val *lb6_revsk_lookup(__u64 cookie,
							     const __be32 addr[4], __be16 port)
{
	struct lb6_revsk_key key = {
		.cookie = cookie,
		.addr = {addr[0], addr[1], addr[2], addr[3]},
		.port = port,
	};

	return ebpflb_revsk6.lookup(&key);
}

#if EBPFLB_HAVE_SK_STORAGE
/* Remember in the socket itself which frontend its backend stands for (TCP): no hash
 * insert, and the entry goes with the socket. */
static __always_inline void lb4_sockrev_store(struct bpf_sock *sk,
					      const struct lb4_backend *backend,
					      __be32 vaddr, __be16 vport)
{
	struct lb4_sock_rev *rev;

	rev = ebpflb_sockrev4.sk_storage_get(sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!rev) {
		stat_inc(STAT_REVSK_UPDATE_FAIL);
		return;
	}
	rev->backend_addr = backend->addr;
	rev->backend_port = backend->port;
	rev->frontend_addr = vaddr;
	rev->frontend_port = vport;
}

/* The socket's stored frontend, if the socket still talks to the backend it was sent to. */
static __always_inline struct lb4_sock_rev *lb4_sockrev_lookup(struct bpf_sock *sk,
							      __be32 addr, __be16 port)
{
	struct lb4_sock_rev *rev = ebpflb_sockrev4.sk_storage_get(sk, NULL, 0);

	if (!rev || rev->backend_addr != addr || rev->backend_port != port)
		return NULL;
	return rev;
}

/* lb4_sockrev_store's twin for a TCP socket connected to an IPv6 frontend. */
static __always_inline void lb6_sockrev_store(struct bpf_sock *sk,
					      const struct lb6_backend *backend,
					      const __be32 vaddr[4], __be16 vport)
{
	struct lb6_sock_rev *rev;

	rev = ebpflb_sockrev6.sk_storage_get(sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!rev) {
		stat_inc(STAT_REVSK_UPDATE_FAIL);
		return;
	}
	rev->backend_addr[0] = backend->addr[0];
	rev->backend_addr[1] = backend->addr[1];
	rev->backend_addr[2] = backend->addr[2];
	rev->backend_addr[3] = backend->addr[3];
	rev->backend_port = backend->port;
	rev->frontend_addr[0] = vaddr[0];
	rev->frontend_addr[1] = vaddr[1];
	rev->frontend_addr[2] = vaddr[2];
	rev->frontend_addr[3] = vaddr[3];
	rev->frontend_port = vport;
}

static __always_inline struct lb6_sock_rev *lb6_sockrev_lookup(struct bpf_sock *sk,
							      const __be32 addr[4], __be16 port)
{
	struct lb6_sock_rev *rev = ebpflb_sockrev6.sk_storage_get(sk, NULL, 0);

	if (!rev || rev->backend_port != port || rev->backend_addr[0] != addr[0] ||
	    rev->backend_addr[1] != addr[1] || rev->backend_addr[2] != addr[2] ||
	    rev->backend_addr[3] != addr[3])
		return NULL;
	return rev;
}
#endif

#endif /* EBPFLB_LB_H */
