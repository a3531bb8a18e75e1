/* Event counters: one per-CPU slot of ebpflb_stats per STAT_* event (consts.h), summed
 * by the agent at scrape time (ebpflb_datapath_events); and per-frontend counters in
 * ebpflb_svcstats, keyed by the frontend's service id (ebpflb_service_* metrics). */
#ifndef EBPFLB_STATS_H
#define EBPFLB_STATS_H

#include "maps.h"

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *count = ebpflb_stats.lookup(&idx);

	if (count)
		*count += 1; /* per-CPU slot: no atomic needed */
}

/* The frontend's counters on this CPU; NULL only for an id beyond the array. */
static __always_inline struct lb_svc_stats *svc_stats(__u32 svc_id)
{
	return ebpflb_svcstats.lookup(&svc_id);
}

static __always_inline void svc_stats_sock_xlated(__u32 svc_id)
{
	struct lb_svc_stats *stats = svc_stats(svc_id);

	if (stats)
		stats->sock_xlated += 1;
}

static __always_inline void svc_stats_refused(__u32 svc_id)
{
	struct lb_svc_stats *stats = svc_stats(svc_id);

	if (stats)
		stats->refused += 1;
}

static __always_inline void svc_stats_np_flow(__u32 svc_id)
{
	struct lb_svc_stats *stats = svc_stats(svc_id);

	if (stats)
		stats->np_flows += 1;
}

/* One packet translated towards a backend; svc_id 0 (a reply) is not counted. */
static __always_inline void svc_stats_np_packet(__u32 svc_id, __u32 len)
{
	struct lb_svc_stats *stats;

	if (!svc_id)
		return;
	stats = svc_stats(svc_id);
	if (stats) {
		stats->np_packets += 1;
		stats->np_bytes += len;
	}
}

#endif /* EBPFLB_STATS_H */
