"""Desired frontends -> BPF maps, writing only what differs.

The reconciler remembers what it has written, diffs the desired state against it, and
writes the difference in an order the datapath can run through at any moment: new
backends before any slot names them; the Maglev slots; the service metadata, then the
service entry, which switches readers to the new table in one atomic map update; and
last, backends no table names any more, and (one sync later) the old slot ranges.

Each part has one job:
- state: what is in the maps now (Realized, the maps read back, the index by owner);
- alloc, space, backends: ids and slot ranges, and the lifetime of backend ids;
- restore: relearning the state and the allocators from the pinned maps;
- plan: the diff of desired against realized, with allocations, as immutable plans;
- records: the Plan and Outcome records the steps pass on (so no step imports another);
- tables, write: the Maglev tables and the ordered write steps, one batch per map;
- report, result: what an apply tells the log, the metrics and its caller;
- reconciler: the Reconciler, which strings them together.

Each frontend succeeds or fails on its own: a full map or slot pool, a table size limit,
or an element the kernel refuses fails only the frontends that needed it, with an error
naming them and the limit; their later steps are not written, so the datapath keeps their
previous state, and no other frontend is touched.
"""

from ebpflb.reconcile.reconciler import Reconciler
from ebpflb.reconcile.report import LOG_EACH_MAX
from ebpflb.reconcile.result import ApplyResult, Failure, Reason
from ebpflb.reconcile.state import Realized, table_digest
from ebpflb.reconcile.write import TABLE_CHUNK

__all__ = [
    "LOG_EACH_MAX",
    "TABLE_CHUNK",
    "ApplyResult",
    "Failure",
    "Realized",
    "Reason",
    "Reconciler",
    "table_digest",
]
