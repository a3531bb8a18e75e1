/* Sizes, flags and counter indexes shared by every ebpflb program.
 *
 * Every size is #ifndef-overridable: the agent passes the configured values as -D flags
 * (ebpflb/config.py, Config.cflags()), so Python owns the numbers and C keeps defaults that
 * let a file compile on its own.
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

/* Slots in the shared Maglev slot pool (ebpflb_slots). Each service owns one contiguous
 * range of a prime length M >= 100 x its backends, so memory follows the number of
 * backends, not services x a fixed maximum. 4 Mi slots = 16 MiB. */
#ifndef EBPFLB_SLOT_POOL_SIZE
#define EBPFLB_SLOT_POOL_SIZE 4194304
#endif

/* Socket reverse-translation entries (ebpflb_revsk4), one per (socket, backend) in use;
 * LRU, so a full map evicts the coldest socket's entry instead of failing a connect(). */
#ifndef EBPFLB_REV_SK_MAX
#define EBPFLB_REV_SK_MAX 262144
#endif

/* Bytes for "namespace/name:port" in ebpflb_svcmeta: 63 + 1 + 63 + 1 + 15 = 143 (+ NUL). */
#ifndef EBPFLB_SVC_NAME_LEN
#define EBPFLB_SVC_NAME_LEN 144
#endif

/* Set by the agent's feature probe when the kernel has bpf_set_retval (5.18+). Without it a
 * refused connect() fails with EPERM instead of ECONNREFUSED. */
#ifndef EBPFLB_HAVE_SET_RETVAL
#define EBPFLB_HAVE_SET_RETVAL 0
#endif

/* lb4_svc_key.scope: which backend set a frontend lookup wants. */
#define LB_SCOPE_EXTERNAL 0 /* all usable backends of the service */
#define LB_SCOPE_INTERNAL 1 /* reserved: node-local backends (traffic policies) */

/* lb4_svc_val.flags: service type of the frontend and per-service behaviour. */
#define SVC_F_CLUSTER_IP    (1 << 0) /* frontend is the ClusterIP */
#define SVC_F_NODE_PORT     (1 << 1) /* frontend is a node address on its nodePort */
#define SVC_F_LOADBALANCER  (1 << 2) /* frontend is a status.loadBalancer ingress IP */
#define SVC_F_EXTERNAL_IP   (1 << 3) /* frontend is one of spec.externalIPs */
#define SVC_F_TERMINATING   (1 << 4) /* only serving+terminating endpoints are left */

/* lb4_backend.flags. */
#define BE_F_LOCAL       (1 << 0) /* endpoint runs on this node */
#define BE_F_TERMINATING (1 << 1) /* endpoint is terminating (used only when nothing is ready) */

/* Indexes into the per-CPU ebpflb_stats array; mirrored by ebpflb.datapath.layout.Counter. */
#define STAT_CONNECT_XLATED  0 /* connect() to a frontend rewritten to a backend */
#define STAT_SENDMSG_XLATED  1 /* sendmsg() to a frontend rewritten to a backend */
#define STAT_RECVMSG_XLATED  2 /* recvmsg() source rewritten back to the frontend */
#define STAT_PEER_XLATED     3 /* getpeername() rewritten back to the frontend */
#define STAT_NO_BACKEND      4 /* refused: the service has no usable backend */
#define STAT_SLOT_MISS       5 /* slot or backend missing: a control-plane ordering bug */
#define STAT_REVSK_UPDATE_FAIL 6 /* reverse entry not stored: getpeername/recvmsg will miss */
#define STAT_MAX             8 /* array size; spare room for new counters */

#endif /* EBPFLB_CONSTS_H */
