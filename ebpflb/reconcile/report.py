"""What an apply tells people: log lines, error messages, metrics.

Every failure names the service, the frontend, the map or limit it hit with its value,
and the option that raises it; it is counted in ebpflb_map_errors_total{map,reason}. A
frontend that keeps failing the same way is logged at error level once, then at debug
level at each retry (it is still counted each time). An apply changing more frontends
than LOG_EACH_MAX logs one summary line, and each frontend at debug level: 100,000 lines
help nobody. Likewise, failures beyond the first LOG_EACH_MAX of an apply are summed up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ebpflb.datapath.maps import MapName
from ebpflb.errors import MapFullError
from ebpflb.maglev import MIN_SLOTS_PER_BACKEND
from ebpflb.model import Frontend, NamespacedName
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.records import Outcome, Plan
from ebpflb.reconcile.result import ApplyResult, Failure

log = logging.getLogger("ebpflb.reconcile")

LOG_EACH_MAX = 100

# The option that sizes each map, for the fix in a "map full" message.
_OPTION_OF_MAP = {
    MapName.SERVICES.value: "--max-services",
    MapName.SERVICE_META.value: "--max-services",
    MapName.BACKENDS.value: "--max-backends",
    MapName.SLOTS.value: "--slot-pool-size",
    MapName.AFFINITY_MATCH.value: "--affinity-max",
}


class Reporter:
    """Reports one apply into its result, the log and the metrics.

    `previous_errors` (kept by the reconciler across applies) holds, for each frontend
    that failed before, its owner and the message it logged; `failures` collects this
    apply's."""

    def __init__(
        self,
        metrics: Metrics | None,
        result: ApplyResult,
        previous_errors: Mapping[Frontend, tuple[NamespacedName, str]],
    ) -> None:
        self.metrics = metrics
        self.result = result
        self.previous_errors = previous_errors
        self.failures: dict[Frontend, tuple[NamespacedName, str]] = {}
        self.verbose = True  # log each added or updated frontend at info level
        self.log_changes = True  # whether `changed` logs anything at its level
        self.verbose_removals = True  # ... and each removed one
        self._new_failures = 0  # logged at error level
        self._unlogged = 0  # new failures beyond LOG_EACH_MAX, logged at debug level

    def conflict(self, frontend: Frontend, owner: NamespacedName, holder: object) -> None:
        message = f"frontend {frontend} of {owner} is already used by {holder}: skipped"
        log.error(message)
        self.result.errors.append(message)
        if self.metrics:
            self.metrics.frontend_conflicts.inc()

    def failed(
        self, service: str, frontend: Frontend, owner: NamespacedName, failure: Failure
    ) -> None:
        message = f"service {service} {frontend} not programmed: {failure.error}"
        option = _OPTION_OF_MAP.get(failure.map_name)
        if isinstance(failure.error, MapFullError) and option:
            message += f"; raise {option}"
        if self.previous_errors.get(frontend) == (owner, message):
            log.debug(message)  # as at its last attempt
        elif self._new_failures < LOG_EACH_MAX:
            log.error(message)
            self._new_failures += 1
        else:
            log.debug(message)
            self._unlogged += 1
        self.failures[frontend] = (owner, message)
        self.result.errors.append(message)
        self.result.failed.add(owner)
        if self.metrics:
            self.metrics.map_errors.labels(failure.map_name, failure.reason.value).inc()

    def undersized(self, plans: Sequence[Plan], max_table_size: int, *, verbose: bool) -> None:
        """Tables that give their backends fewer than 100 slots each: Maglev still gives
        every backend a share, but the shares may differ by more than the paper's 1%."""
        fix = "raise --maglev-max-table-size for an even spread"
        if not verbose:
            log.warning(
                "%d frontends have fewer than %d Maglev slots per backend (the largest table"
                " allowed has %d slots); first: %s; %s",
                len(plans),
                MIN_SLOTS_PER_BACKEND,
                max_table_size,
                plans[0].label(),
                fix,
            )
        for plan in plans:
            log.log(
                logging.WARNING if verbose else logging.DEBUG,
                "service %s: %d backends share the largest Maglev table allowed (%d slots),"
                " fewer than %d slots each; %s",
                plan.label(),
                len(plan.usable),
                plan.size,
                MIN_SLOTS_PER_BACKEND,
                fix,
            )

    def set_verbose(self, verbose: bool) -> None:
        """Log each added or updated frontend at info level (else at debug level)."""
        self.verbose = verbose
        self.log_changes = log.isEnabledFor(logging.INFO if verbose else logging.DEBUG)

    def changed(self, outcome: Outcome, old_ids: tuple[int, ...], backends: Backends) -> None:
        """A frontend added or updated."""
        log.log(
            logging.INFO if self.verbose else logging.DEBUG,
            "%s",
            describe(outcome, old_ids, backends),
        )

    def removed(self, name: str, frontend: Frontend) -> None:
        log.log(
            logging.INFO if self.verbose_removals else logging.DEBUG,
            "service %s %s removed",
            name or "(unnamed)",
            frontend,
        )

    def unlogged_failures(self) -> None:
        if self._unlogged:
            log.error(
                "%d more frontends not programmed (each logged at debug level; counted in"
                " ebpflb_map_errors_total)",
                self._unlogged,
            )

    def summary(self, frontends: int, failed: int) -> None:
        result = self.result
        log.info(
            "applied %d frontends: %d added, %d updated, %d removed, %d unchanged, %d"
            " failed, %d slots written",
            frontends,
            result.added,
            result.updated,
            result.removed,
            result.unchanged,
            failed,
            result.slots_written,
        )


def describe(outcome: Outcome, old_ids: tuple[int, ...], backends: Backends) -> str:
    plan, entry = outcome.plan, outcome.entry
    assert entry is not None
    current = plan.current
    if current is None:
        table = (
            f"{plan.size} slots at {entry.table_off}"
            if plan.size
            else "no usable endpoint (refusing)"
        )
        return f"service {plan.label()} added: {len(plan.usable)} backends, {table}"
    ids = outcome.table_ids
    added = backends.addresses(set(ids) - set(old_ids))
    gone = backends.addresses(set(old_ids) - set(ids))
    resized = current.entry.table_size != plan.size
    return (
        f"service {plan.label()} updated: backends {current.entry.backend_count} ->"
        f" {len(plan.usable)}{' +' + ','.join(added) if added else ''}"
        f"{' -' + ','.join(gone) if gone else ''}, {outcome.written} slots written"
        f"{f' (table {current.entry.table_size} -> {plan.size})' if resized else ''}"
    )
