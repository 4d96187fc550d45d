"""nc_matmul's accumulate=None, as the NKI compiler has it: a matmul
overwrites the PSUM locations no earlier matmul of the kernel wrote and
accumulates onto the others (tracked per element of each allocation)."""
import numpy as np

from tern import _core
from tern.nki import _tracer


def _isa():
    from tern.nki import isa
    return isa


def auto_accumulate(dst, view, accumulate):
    """accumulate=None: a matmul overwrites the PSUM locations no earlier
    matmul of the kernel wrote and accumulates onto those one did (tracked
    per element of the allocation, so a fresh tile at a reused address
    starts over). One instruction accumulates or not: where it covers both,
    tern first zeroes the unwritten columns (a Vector memset)."""
    alloc = dst._alloc
    if alloc is None or alloc.dtype is None or _core.dtype_size(dst.dtype) != _core.dtype_size(alloc.dtype):
        written = alloc.matmul_written if alloc is not None else _tracer.current().matmul_targets
        key = repr(view)
        if accumulate is None:
            accumulate = key in written
        written.add(key)
        return bool(accumulate)
    # Fast paths: the first matmul into the tile, and a view written before.
    key = (dst._p0, dst._np, dst._off, tuple(dst._free))
    views = alloc.matmul_written
    if not views or key in views:
        if accumulate is None:
            accumulate = bool(views)
        views.add(key)
        return bool(accumulate)
    if alloc.matmul_mask is None:  # element by element from here on
        alloc.matmul_mask = np.zeros((max(128, dst._p0 + dst._np), alloc.free), bool)
        for p0, n, off, free in views:
            alloc.matmul_mask[p0:p0 + n, _columns(off, free)] = True
    cols = _columns(dst._off, dst._free)
    rows = slice(dst._p0, dst._p0 + dst._np)
    seen = alloc.matmul_mask[rows][:, cols]
    if accumulate is None:
        accumulate = bool(seen.any())
        if accumulate and not seen.all():
            _zero_unwritten(dst, seen)
    alloc.matmul_mask[rows, cols] = True
    views.add(key)
    return bool(accumulate)


def _columns(off, free):
    """The element offsets (in a partition) of a view's free pattern, flat."""
    if not free:
        return np.array([off])
    return (off + sum(np.ix_(*[np.arange(c) * s for s, c in free]))).reshape(-1)


def _zero_unwritten(dst, seen):
    """Zeroes the columns (flat free index) of dst no matmul wrote yet."""
    if not (seen == seen[0:1]).all():
        raise NotImplementedError("not supported: a matmul onto PSUM rows written in part by earlier matmuls "
                                  f"(partitions differ; {_tracer.kernel_location()})")
    counts = [c for _, c in dst._free] or [1]
    unwritten = np.flatnonzero(~seen[0])
    # Runs of consecutive unwritten elements, each within one row of the
    # last free dim: one memset per run.
    breaks = np.flatnonzero((np.diff(unwritten) != 1) | (unwritten[1:] % counts[-1] == 0)) + 1
    for run in np.split(unwritten, breaks):
        first = np.unravel_index(int(run[0]), counts)
        lead = tuple(int(i) for i in first[:-1])
        key = (slice(None),) + lead + (slice(int(first[-1]), int(first[-1]) + len(run)),)
        _isa().memset(dst=dst[key] if dst._free else dst, value=0.0)
