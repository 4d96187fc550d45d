"""What the NKI compiler does to a legacy kernel's instructions before they
run, and tern does while tracing:

- Loop-invariant code motion: an instruction inside an `affine_range` or
  `sequential_range` loop whose inputs were all produced before the loop
  (and not written since) computes the same tile in every iteration; the
  compiler computes it once. tern traces loops unrolled, so it sees the
  same call (same kernel line, same input tiles at the same write version,
  same parameters) again in a later iteration, and hands back the tile the
  first iteration computed instead of issuing the instruction again.
  `static_range` loops are unrolled by the compiler too, so their bodies
  belong to the enclosing loop.
- A new tile assigned into a view (`view[...] = nisa.op(...)`) is the
  instruction writing that view: the instruction is held until the next
  one is issued, and the assignment retargets it (no copy).

Both keep the results bit for bit: the hoisted instruction is the same
instruction on the same data, and the retargeted one rounds once to the
view's dtype, as the copy did (it is only retargeted when that holds).
"""
import builtins
import sys

from tern.nki import _tensor as T
from tern.nki import _tracer


def wrote(x):
    """x (a tile or view) is written by the instruction being issued."""
    alloc = getattr(x, "_alloc", None)
    if alloc is not None:
        alloc.version += 1


class Loop:
    """range(...) as nl.affine_range / nl.sequential_range return it: while
    its body is traced, it is the loop whose invariant results are kept."""

    def __init__(self, *args):
        self._range = builtins.range(*args)

    def __len__(self):
        return len(self._range)

    def __getitem__(self, i):
        return self._range[i]

    def __contains__(self, x):
        return x in self._range

    def __reversed__(self):
        return reversed(self._range)

    def __repr__(self):
        return repr(self._range)

    def __iter__(self):
        tr = _tracer._current
        if tr is None:
            yield from self._range
            return
        # seq0: tiles allocated from here on are the loop's own.
        frame = {"iteration": 0, "cache": {}, "seq0": tr.alloc_seq}
        tr.loops.append(frame)
        try:
            for i, v in enumerate(self._range):
                frame["iteration"] = i
                yield v
        finally:
            # By identity: another loop's frame may compare equal.
            tr.loops[:] = [f for f in tr.loops if f is not frame]


def _tile_key(t, seq0):
    a = t._alloc
    if a is None or a.seq >= seq0:
        return None  # HBM (DMA-written) or made inside the loop: not invariant
    # A tile the kernel still names can only have been released by liveness
    # (Trace.free_dead): its last use was this call in an earlier iteration,
    # hoisted out of the loop, so the call still matches that one.
    return ("tile", a.seq, a.version, t._p0, t._np, t._off, tuple(t._free), t.dtype, str(t.buffer))


def _param_key(x, seq0):
    if isinstance(x, T.NkiTensor):
        return _tile_key(x, seq0)
    if x is None or isinstance(x, (bool, int, float, str)):
        return ("value", x)
    if isinstance(x, (tuple, list)):
        parts = tuple(_param_key(v, seq0) for v in x)
        return None if any(p is None for p in parts) else ("seq", parts)
    name = getattr(x, "name", None) or getattr(x, "__name__", None)
    if isinstance(name, str):  # nl operators, numpy ufuncs, enums
        return ("named", type(x).__name__, name, str(getattr(x, "value", "")))
    return None


def key(op, params):
    """The identity of a call inside the innermost traced loop, or None when
    it cannot be hoisted (no loop, an operand that is not a tile or a plain
    value)."""
    tr = _tracer._current
    if tr is None or not tr.loops:
        return None
    seq0 = tr.loops[-1]["seq0"]
    parts = tuple(_param_key(p, seq0) for p in params)
    if any(p is None for p in parts):
        return None
    return (op, _tracer.kernel_location(), parts)


def lookup(k):
    """The tile an earlier iteration of the innermost loop computed for the
    same call, if it is still intact and nothing but this cache holds it
    (a kernel still holding it, or a view of it, could see the aliasing)."""
    if k is None:
        return None
    frame = _tracer.current().loops[-1]
    entry = frame["cache"].get(k)
    if entry is None:
        return None
    tile, version, iteration = entry
    a = tile._alloc
    if a.released or a.version != version:
        del frame["cache"][k]  # freed or written since: it can never match again
        return None
    # Held by the cache's entry, this function and getrefcount's argument,
    # and at most one more: the kernel's variable that the call's result is
    # about to replace. No view of it may be alive (only the tile holds its
    # allocation, held here too).
    shared = sys.getrefcount(tile) > 4 or sys.getrefcount(a) > 3
    if shared or iteration >= frame["iteration"]:
        return None
    return tile


def remember(k, tile):
    if k is None:
        return
    tr = _tracer.current()
    if tr.loops:
        frame = tr.loops[-1]
        frame["cache"][k] = (tile, tile._alloc.version, frame["iteration"])


class Held:
    """A legacy instruction computing `tile`, held until the next one:
    called with a view, it issues the instruction into that view."""

    def __init__(self, tile, issue, k, engine, operands):
        self.tile, self._issue, self._key = tile, issue, k
        self.engine, self.operands = engine, operands

    def __call__(self, view):
        self._issue(view)
        if view is self.tile:
            remember(self._key, self.tile)

    def fits(self, view):
        """Whether the instruction can write `view` instead of its own tile
        with the same bits: the same shape, one rounding (the tile's dtype is
        the view's or FP32), an engine that reaches the view's memory, no
        input in the view's allocation."""
        from tern import _core
        if view.is_hbm or tuple(view.shape) != tuple(self.tile.shape):
            return False
        if self.tile.dtype not in (view.dtype, "float32"):
            return False
        if view.buffer is T.psum and self.engine == _core.Engine.gpsimd:
            return False
        return all(getattr(o, "_alloc", None) is not view._alloc for o in self.operands)


def issue(op, tile, operands, params, run, engine):
    """A legacy instruction's result: an earlier iteration's tile when the
    instruction is loop-invariant, else `tile`, its instruction held (see
    Held); run(view) issues it into a view."""
    tr = _tracer.current()
    k = key(op, list(operands) + list(params) + [tile.dtype, tuple(tile.shape)])
    hit = lookup(k)
    if hit is not None:
        return hit
    # Tiles among the parameters (a scan's initial, a column operand) are read too.
    tr.defer(tile, Held(tile, run, k, engine, list(operands) + [p for p in params if isinstance(p, T.NkiTensor)]))
    return tile


def take(view, value):
    """Issues the held instruction computing `value` into `view` when it
    can (True), else False."""
    tr = _tracer.current()
    if tr.deferred is None or tr.deferred[0] is not value:
        return False
    held = tr.deferred[1]
    if not isinstance(held, Held) or not held.fits(view):
        return False
    tr.deferred = None  # issued here, into the view, instead of at the next instruction
    held(view)
    return True
