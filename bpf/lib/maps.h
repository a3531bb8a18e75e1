/* Map definitions only. All are pinned under EBPFLB_PIN_DIR: BCC opens an existing pin or
 * creates and pins the map, so maps (and the traffic they steer) outlive the agent. The
 * agent checks a pin's type and sizes before compiling (ebpflb/datapath/loader.py). */
#ifndef EBPFLB_MAPS_H
#define EBPFLB_MAPS_H

#include "structs.h"

/* Frontend -> service: table location, flags. The first lookup of every translation. */
BPF_TABLE_PINNED("hash", struct lb4_svc_key, struct lb4_svc_val, ebpflb_svc4,
		 EBPFLB_MAX_SERVICES, EBPFLB_PIN_DIR "/ebpflb_svc4");

/* Backend id -> address; shared by every service that uses the backend. */
BPF_TABLE_PINNED("hash", __u32, struct lb4_backend, ebpflb_be4,
		 EBPFLB_MAX_BACKENDS, EBPFLB_PIN_DIR "/ebpflb_be4");

/* Maglev slot pool: slot -> backend id; each service owns a contiguous range. */
BPF_TABLE_PINNED("array", __u32, __u32, ebpflb_slots,
		 EBPFLB_SLOT_POOL_SIZE, EBPFLB_PIN_DIR "/ebpflb_slots");

/* Service id -> "namespace/name:port", for dumps and agent restarts only. */
BPF_TABLE_PINNED("hash", __u32, struct lb4_svc_meta, ebpflb_svcmeta,
		 EBPFLB_MAX_SERVICES, EBPFLB_PIN_DIR "/ebpflb_svcmeta");

/* (socket cookie, backend) -> frontend, for recvmsg4/getpeername4. */
BPF_TABLE_PINNED("lru_hash", struct lb4_revsk_key, struct lb4_revsk_val, ebpflb_revsk4,
		 EBPFLB_REV_SK_MAX, EBPFLB_PIN_DIR "/ebpflb_revsk4");

/* Per-CPU event counters (STAT_*), summed by the agent at scrape time. */
BPF_TABLE_PINNED("percpu_array", __u32, __u64, ebpflb_stats,
		 STAT_MAX, EBPFLB_PIN_DIR "/ebpflb_stats");

#endif /* EBPFLB_MAPS_H */
