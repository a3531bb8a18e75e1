"""Backend ids and their lifetime: allocation, references, collection of unused ones.

A backend (address, port, protocol) has one id, shared by every table that names it. Its
entry is written before any slot names it and deleted after the last slot stopped naming
it: references count the realized tables naming an id, and an id whose count dropped to 0
is a candidate that `collect` deletes at the end of an apply, once every table is written.

The ids allocated while planning are remembered in order: when a frontend cannot be
planned (the map is full), the ids it took (those since its `mark`) are given back at
once, before the next frontend is planned, so one oversized service never starves a
small one of ids.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping

from ebpflb.datapath.maps import BackendEntry, KeyValueMap
from ebpflb.model import Backend
from ebpflb.reconcile.alloc import IdAllocator
from ebpflb.reconcile.result import ApplyResult
from ebpflb.reconcile.state import BackendIds


class Backends:
    def __init__(self, map_name: str, capacity: int) -> None:
        self._ids = IdAllocator(map_name, capacity)
        self._id_of: dict[Backend, int] = {}
        self._backend_of: dict[int, Backend] = {}  # every id in use, written or not
        self.entries: dict[int, BackendEntry] = {}  # as in the map
        # Tables naming each id in use, indexed by id: 4 bytes an id, where a dict took ~40
        # (a million backends at 100,000 services x 10 endpoints).
        self._refs = array("i", bytes(4 * (capacity + 1)))
        self._maybe_unused: set[int] = set()  # ids whose references dropped to 0
        self._taken: list[int] = []  # ids allocated while planning, in order

    # ---- planning ------------------------------------------------------------------------

    def mark(self) -> int:
        """Where the ids allocated from now on start, for `give_back_since`."""
        return len(self._taken)

    def give_back_since(self, mark: int) -> None:
        """Give back every id allocated since `mark` (a plan that failed): no table names
        them, no entry was written for them, and no other frontend was planned with them."""
        for backend_id in self._taken[mark:]:
            backend = self._backend_of.pop(backend_id)
            del self._id_of[backend]
            self._refs[backend_id] = 0
            self._maybe_unused.discard(backend_id)
            self._ids.release(backend_id)
        del self._taken[mark:]

    def planned(self) -> None:
        """Planning is over: the ids allocated stay (collected if no table names them)."""
        self._taken.clear()

    def id_for(self, backend: Backend, service: str) -> int:
        """The backend's id, allocated if it has none (MapFullError when the map is full).
        A new id is collected at the end of the apply unless a table written names it."""
        backend_id = self._id_of.get(backend)
        if backend_id is None:
            backend_id = self._ids.allocate(lambda: f"backend {backend} of {service}")
            self._id_of[backend] = backend_id
            self._backend_of[backend_id] = backend
            self._refs[backend_id] = 0
            self._maybe_unused.add(backend_id)
            self._taken.append(backend_id)
        return backend_id

    # ---- restore -------------------------------------------------------------------------

    def adopt(self, backend_id: int, entry: BackendEntry) -> None:
        """A backend found in the map. The same backend under two ids: the one no table
        names is collected."""
        self._id_of.setdefault(entry.backend, backend_id)
        self._backend_of[backend_id] = entry.backend
        self.entries[backend_id] = entry
        self._ids.reserve(backend_id)
        self._refs[backend_id] = 0

    def drifted(self, previous: Mapping[int, BackendEntry]) -> set[int]:
        """Ids whose entry differs from `previous` (what was written before a restore)."""
        return {i for i, entry in previous.items() if self.entries.get(i) != entry}

    def count_unreferenced(self) -> None:
        """After a restore has referenced every table: the ids no table names."""
        refs = self._refs
        self._maybe_unused = {i for i in self._backend_of if refs[i] == 0}

    # ---- references ----------------------------------------------------------------------

    def reference(self, new_ids: BackendIds, old_ids: BackendIds = ()) -> None:
        """A table naming `new_ids` replaced one naming `old_ids`."""
        if new_ids == old_ids:
            return
        refs = self._refs
        limit = len(refs)
        for backend_id in set(new_ids).difference(old_ids):
            if backend_id < limit:  # past the map (a table left by a larger one): no backend
                refs[backend_id] += 1
        for backend_id in set(old_ids).difference(new_ids):
            self.unref(backend_id)

    def unref(self, backend_id: int) -> None:
        if backend_id >= len(self._refs):
            return  # never counted (reference)
        self._refs[backend_id] -= 1
        if self._refs[backend_id] <= 0:
            self._maybe_unused.add(backend_id)

    # ---- after writing -------------------------------------------------------------------

    def collect(self, backends: KeyValueMap[int, BackendEntry], result: ApplyResult) -> None:
        """Delete backends no table names any more (after every slot stopped naming them),
        and give back the ids of new backends whose frontends failed."""
        candidates, self._maybe_unused = self._maybe_unused, set()
        for backend_id in sorted(candidates):
            if self._refs[backend_id] > 0 or backend_id not in self._backend_of:
                continue
            entry = self.entries.pop(backend_id, None)
            if entry is not None:  # else it never reached the map
                backends.delete(backend_id)
                result.count_write(backends.name)
            self._ids.release(backend_id)
            self._refs[backend_id] = 0
            backend = self._backend_of.pop(backend_id, None)
            if backend is not None and self._id_of.get(backend) == backend_id:
                del self._id_of[backend]

    def addresses(self, ids: Iterable[int]) -> list[str]:
        """The written backends among `ids`, as sorted "address:port" strings (for logs)."""
        return sorted(str(self.entries[i].backend) for i in ids if i in self.entries)

    def __len__(self) -> int:
        """Backends written to the map."""
        return len(self.entries)
