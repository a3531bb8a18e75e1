/* Load balancing shared by every program: frontend lookup and Maglev slot -> backend
 * selection; for the socket programs also refusal and the socket reverse entries. */
#ifndef EBPFLB_LB_H
#define EBPFLB_LB_H

#include <linux/errno.h>
#include "maps.h"
#include "stats.h"

static __always_inline struct lb4_svc_val *lb4_lookup_service(__be32 addr, __be16 port,
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
static __always_inline struct lb4_svc_val *lb4_lookup_service_in_node(__be32 addr, __be16 port,
								       __u8 proto)
{
	struct lb4_svc_val *svc, *internal;

	svc = lb4_lookup_service(addr, port, proto, LB_SCOPE_EXTERNAL);
	if (!svc || !(svc->flags & SVC_F_INTERNAL_SCOPE))
		return svc;
	internal = lb4_lookup_service(addr, port, proto, LB_SCOPE_INTERNAL);
	return internal ? internal : svc;
}

/* Backend in slot (hash mod M) of the service's table, its id in *backend_id_out; NULL
 * when the service has no usable backend (table_size == 0) or, counted as
 * STAT_SLOT_MISS, when a slot or backend is missing. */
static __always_inline struct lb4_backend *lb4_select_backend(const struct lb4_svc_val *svc,
							      __u32 hash, __u32 *backend_id_out)
{
	struct lb4_slot_pair *pair;
	struct lb4_backend *backend;
	__u32 slot, pair_index, backend_id;

	if (svc->table_size == 0)
		return NULL;
	slot = svc->table_off + hash % svc->table_size;
	pair_index = slot >> 1;
	pair = ebpflb_slots.lookup(&pair_index);
	if (!pair)
		goto miss;
	backend_id = pair->backend_id[slot & 1];
	if (backend_id == 0)
		goto miss;
	backend = ebpflb_be4.lookup(&backend_id);
	if (!backend)
		goto miss;
	*backend_id_out = backend_id;
	return backend;
miss:
	stat_inc(STAT_SLOT_MISS);
	return NULL;
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

#endif /* EBPFLB_LB_H */
