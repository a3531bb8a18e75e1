/* Event counters: one per-CPU slot of ebpflb_stats per STAT_* event (consts.h), summed
 * by the agent at scrape time (ebpflb_datapath_events). */
#ifndef EBPFLB_STATS_H
#define EBPFLB_STATS_H

#include "maps.h"

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *count = ebpflb_stats.lookup(&idx);

	if (count)
		*count += 1; /* per-CPU slot: no atomic needed */
}

#endif /* EBPFLB_STATS_H */
