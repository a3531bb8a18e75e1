# The C extension's interface (ebpflb/maglev/fill.c), for mypy.
import numpy as np
import numpy.typing as npt

def fill_many(
    offsets: npt.NDArray[np.int64],
    skips: npt.NDArray[np.int64],
    weights: npt.NDArray[np.int64],
    backend_starts: npt.NDArray[np.int64],
    out: npt.NDArray[np.int32],
    slot_starts: npt.NDArray[np.int64],
    /,
) -> None: ...
