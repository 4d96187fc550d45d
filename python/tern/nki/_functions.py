"""Tile-level NKI: the nl.* math, reductions, transpose and matmul on whole
tiles, Python operators on tiles, assignment into views, broadcasting and
masks. Each call issues the nki.isa instructions the NKI compiler would
(Vector for arithmetic, Scalar for activation functions, Tensor for
transposes and matmuls) into a new SBUF tile (PSUM for matmul and
transpose), with NKI's type promotion."""
import math

from tern.nki import _tensor as T
from tern.nki import _tracer


def _isa():
    from tern.nki import isa
    return isa


def _nl():
    from tern.nki import language
    return language


# ------------------------------------------------------------ dtypes
_FLOAT_RANK = {"float8_e4m3": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "bfloat16": 2, "float16": 2,
               "tfloat32": 3, "float32": 4}
_INT_SIZE = {"int8": (1, True), "uint8": (1, False), "int16": (2, True), "uint16": (2, False),
             "int32": (4, True), "uint32": (4, False)}


def scalar_dtype(x):
    """Python scalars are int32 / float32 (bool: uint8) in NKI's promotion."""
    if isinstance(x, bool):
        return "uint8"
    return "int32" if isinstance(x, int) else "float32"


def promote(a, b):
    """NKI's result dtype of an operation on dtypes a and b (the documented
    promotion rules: the float wins over an int; of two floats the wider,
    fp16 with bf16 and two different fp8s widen; of two ints the wider,
    mixed signedness widens to the next signed type, int32 with uint32 is
    float32)."""
    if a == b:
        return a
    fa, fb = a in _FLOAT_RANK, b in _FLOAT_RANK
    if fa and fb:
        pair = {a, b}
        if pair == {"float16", "bfloat16"}:
            return "float32"
        if all(_FLOAT_RANK[x] == 1 for x in pair):
            return "bfloat16"
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    if fa or fb:
        return a if fa else b
    (sa, ga), (sb, gb) = _INT_SIZE.get(a, (4, True)), _INT_SIZE.get(b, (4, True))
    if ga == gb:
        return a if sa >= sb else b
    signed, unsigned = (a, b) if ga else (b, a)
    if _INT_SIZE[signed][0] > _INT_SIZE[unsigned][0]:
        return signed
    size = 2 * _INT_SIZE[unsigned][0]
    return {2: "int16", 4: "int32"}.get(size, "float32")


def dtype_of(x):
    return x.dtype if isinstance(x, T.NkiTensor) else scalar_dtype(x)


# ------------------------------------------------------------ new tiles
def new_tile(shape, dtype, buffer=None):
    return _nl().ndarray(tuple(shape), dtype, buffer=buffer or T.sbuf)


def _as_op(op):
    """An nl operator, or a numpy function passed as one (np.add, np.max ...)."""
    from tern.nki import _ops
    return _ops.resolve(op)


# ------------------------------------------------------------ masks
def mask_ranges(mask):
    """None when nothing is masked; raises T.Empty when everything is."""
    if mask is None or mask is True:
        return None
    if mask is False:
        raise T.Empty()
    if not isinstance(mask, (T.Predicate, T.Box)):
        return None if bool(mask) else _raise_empty()
    return mask.ranges()


def mask_boxes(mask):
    """The boxes of index values a mask keeps: [None] for no mask, [] when
    it keeps nothing."""
    if mask is None or mask is True:
        return [None]
    if mask is False:
        return []
    if not isinstance(mask, (T.Predicate, T.Box)):
        return [None] if bool(mask) else []
    return mask.boxes()


def for_boxes(mask, body):
    """body(ranges) once per box the mask keeps (one instruction each)."""
    for ranges in mask_boxes(mask):
        try:
            body(ranges)
        except T.Empty:
            pass


def _inside(limit, ranges):
    terms, off, extent, _ = limit
    lo = hi = off
    for uid, (v, c) in terms.items():
        a, b = (ranges[uid][1], ranges[uid][2] - 1) if ranges and uid in ranges else (0, v.extent - 1)
        if b < a:
            return True  # nothing of it is accessed
        lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
    return lo >= 0 and hi < extent


def _raise_empty():
    raise T.Empty()


def restrict(view, ranges):
    """The part of `view` a mask keeps (dims matched by index variable, or
    by grid axis for a view built without index expressions)."""
    if not ranges:
        return view
    p0, np_, off, free = view._p0, view._np, view._off, list(view._free)
    for uid, (var, lo, hi) in ranges.items():
        d = None
        if view._vars:
            d = next((i for i, v in enumerate(view._vars) if v is not None and v.uid is uid), None)
        if d is None:
            if view._vars and any(v is not None for v in view._vars):
                continue
            d = 0 if var.axis == 0 else min(var.axis, view.ndim - 1)
            if d >= view.ndim or view.shape[d] != var.extent:
                continue
        if hi <= lo:
            raise T.Empty()
        if d == 0:
            if view.is_hbm:
                off += lo * view._row_stride
            else:
                p0 += lo
            np_ = min(np_, hi) - lo
        else:
            s, c = free[d - 1]
            off += lo * s
            free[d - 1] = (s, min(c, hi) - lo)
    out = view._like(p0, np_, off, free, vars_=view._vars)
    out._limits = {k: lim for k, lim in view._limits.items() if not _inside(lim, ranges)}
    out._origin = getattr(view, "_origin", None)
    return out


# ------------------------------------------------------------ high rank
MAX_FREE_DIMS = 4  # an access pattern's free dims (isa::kMaxFreeDims)


def each(call, *views):
    """call(*views), split over the leading free dim while a view has more
    free dims than an instruction takes (as the NKI compiler splits a
    high-rank tile expression into several instructions)."""
    tiles = [v for v in views if isinstance(v, T.NkiTensor)]
    if not tiles or max(v.ndim - 1 for v in tiles) <= MAX_FREE_DIMS:
        return call(*views)
    lead = max(tiles, key=lambda v: v.ndim)
    for i in range(lead.shape[1]):
        call_views = [v[:, i] if isinstance(v, T.NkiTensor) and v.ndim == lead.ndim else v for v in views]
        each(call, *call_views)


# ------------------------------------------------------------ broadcasting
def _result_shape(a, b):
    """Partition-aligned broadcasting: dim 0 first, then the free dims
    right-aligned as numpy does."""
    sa, sb = a.shape, b.shape
    p = max(sa[0], sb[0]) if 1 in (sa[0], sb[0]) else sa[0]
    if sa[0] != sb[0] and 1 not in (sa[0], sb[0]):
        raise ValueError(f"shapes {sa} and {sb} differ in the partition dim")
    fa, fb = sa[1:], sb[1:]
    n = max(len(fa), len(fb))
    fa, fb = (1,) * (n - len(fa)) + fa, (1,) * (n - len(fb)) + fb
    free = []
    for x, y in zip(fa, fb):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {sa} and {sb} do not broadcast")
        free.append(max(x, y))
    return (p,) + tuple(free)


def fit(t, shape, engines=True):
    """t seen with `shape`: free dims of size 1 repeat by stride 0; a single
    partition is copied to every partition (broadcast_partitions; engines:
    the result is read by a compute engine, not a DMA)."""
    if t.shape[0] != shape[0]:
        t = broadcast_partitions(t, shape[0], engines)
    free = list(t._free)
    n = len(shape) - 1
    if len(free) > n:
        if all(c == 1 for _, c in free[:len(free) - n]):
            free = free[len(free) - n:]
        else:
            raise ValueError(f"cannot broadcast {t.shape} to {shape}")
    free = [(0, 1)] * (n - len(free)) + free
    out = []
    for (s, c), want in zip(free, shape[1:]):
        if c == want:
            out.append((s, c))
        elif c == 1:
            out.append((0, want))
        else:
            raise ValueError(f"cannot broadcast {t.shape} to {shape}")
    return t._like(t._p0, t._np, t._off, out)


def broadcast_partitions(t, parts, engines=True):
    """t's single partition on `parts` partitions. For an FP32 row read by
    a compute engine (engines=True) this is what the NKI compiler does
    (architecture guide, "Partition Broadcast"): a Tensor-engine matmul of
    a [1, parts] ones stationary with the row as the moving tensor, into a
    PSUM tile (a row of at most one PSUM bank, 2 KiB). Otherwise (a longer
    row, no room in PSUM, other dtypes: their PSUM result would be FP32,
    a DMA destination) a new SBUF tile: one DMA
    from HBM when t was loaded whole from there (row stride 0), else
    SBUF-to-SBUF DMAs doubling the filled partitions."""
    if t.shape[0] != 1:
        raise ValueError(f"cannot broadcast {t.shape[0]} partitions to {parts}")
    isa = _isa()
    if engines and parts > 1 and t.dtype == "float32":
        out = _tensor_engine_broadcast(t, parts)
        if out is not None:
            return out
    out = new_tile((parts,) + t.shape[1:], t.dtype)
    origin = getattr(t, "_origin", None)
    if origin is not None:
        isa.dma_copy(dst=out, src=origin._like(origin._p0, parts, origin._off, origin._free, 0))
        return out
    isa.dma_copy(dst=out[0:1], src=t)
    have = 1
    while have < parts:
        n = min(have, parts - have)
        isa.dma_copy(dst=out[have:have + n], src=out[0:n])
        have += n
    return out


def _ones_row(parts):
    """A [1, parts] FP32 tile of ones, made once per program part (the
    stationary of partition broadcasts)."""
    tr = _tracer.current()
    key = (len(tr.segments), parts)  # SBUF does not survive a collective
    if key not in tr.ones_rows:
        ones = new_tile((1, parts), "float32")
        _isa().memset(dst=ones, value=1.0)
        tr.ones_rows[key] = ones
    return tr.ones_rows[key]


def _tensor_engine_broadcast(t, parts):
    """out[p, :] = 1.0 * row for p < parts on the Tensor engine (exact: one
    product per element); None when the row is longer than a PSUM bank or
    the PSUM tile does not fit now."""
    from tern import _core
    row = _sbuf_operand(t) if t.buffer is T.psum else t
    if not row._contiguous():
        return None
    # An engine reads a PSUM operand inside one bank (2 KiB a partition):
    # a longer row is broadcast into SBUF instead.
    if row.size > _nl().tile_size.psum_fmax:
        return None
    flat = row.reshape((1, row.size))
    try:
        out = new_tile((parts,) + t.shape[1:], "float32", T.psum)
    except _core.TernError as e:
        if "does not fit" in str(e):
            return None
        raise
    dst = out.reshape((parts, row.size))
    _isa().nc_matmul(dst=dst, stationary=_ones_row(parts), moving=flat, accumulate=False)
    return out


def broadcast_to(t, shape):
    if t.shape == shape:
        return t
    return fit(t, shape)


# ------------------------------------------------------------ elementwise
def _pending(x):
    return isinstance(x, LazyMatmul) and x._pending is not None


def _sbuf_operand(x):
    """A PSUM operand copied to SBUF (when two would be in PSUM)."""
    if x.buffer is T.psum:
        y = new_tile(x.shape, x.dtype)
        _isa().tensor_copy(dst=y, src=x)
        return y
    return x


def _column_operand(a, b, shape):
    """0 or 1 when that operand of a binary op is a float [P, 1] column and
    the other a float tile of the result's shape; else None."""
    if len(shape) < 2 or math.prod(shape[1:]) == 1:
        return None
    for i, (c, t) in enumerate(((a, b), (b, a))):
        if (tuple(t.shape) == tuple(shape) and c.shape[0] == shape[0] and c.size == c.shape[0]
                and all(_isa()._is_float(v.dtype) for v in (c, t))):
            return i
    return None


def binary(op, a, b, dtype=None, mask=None, dst=None):
    """a op b for tiles and scalars (nl.add, a + b, ...)."""
    op = _as_op(op)
    at, bt = isinstance(a, T.NkiTensor), isinstance(b, T.NkiTensor)
    if not at and not bt:
        raise TypeError(f"{op!r} of two scalars inside a kernel: compute it in Python")
    isa = _isa()
    if at and bt:
        shape = _result_shape(a, b)
    else:
        shape = (a if at else b).shape
    out_dtype = dtype or promote(dtype_of(a), dtype_of(b))
    if dst is None:
        dst = new_tile(shape, out_dtype)
    col = _column_operand(a, b, shape) if at and bt else None
    if col is not None:
        # A tile and a per-partition [P, 1] column: one tensor_scalar with
        # the column as its operand (half a tensor_tensor's cost on fp32).
        x, y = (b, a) if col == 0 else (a, b)
    elif at and bt:
        x, y = fit(a, shape), fit(b, shape)
        if x.buffer is T.psum and y.buffer is T.psum:
            y = _sbuf_operand(y)
    else:
        t, s = (a, b) if at else (b, a)
        t = fit(t, shape)

    def body(ranges):
        d = restrict(dst, ranges)
        if col is not None:
            each(lambda o, p, q: isa.tensor_scalar(dst=o, data=p, op0=op, operand0=q, reverse0=col == 0), d,
                 restrict(x, ranges), restrict(fit(y, shape), ranges))
        elif at and bt:
            each(lambda o, p, q: isa.tensor_tensor(dst=o, data1=p, data2=q, op=op), d, restrict(x, ranges),
                 restrict(y, ranges))
        else:
            each(lambda o, p: isa.tensor_scalar(dst=o, data=p, op0=op, operand0=float(s), reverse0=not at), d,
                 restrict(t, ranges))
    for_boxes(mask, body)
    return dst


def unary(op, x, dtype=None, mask=None, dst=None, **kw):
    """An activation function of a tile (Scalar engine), or an ALU-only
    unary (abs, negative) on the Vector engine."""
    isa = _isa()
    op = _as_op(op)
    if dst is None:
        dst = new_tile(x.shape, dtype or x.dtype)
    def body(ranges):
        d, src = restrict(dst, ranges), restrict(x, ranges)
        if op.act is not None:
            each(lambda o, p: isa.activation(dst=o, op=op, data=p, **kw), d, src)
        elif op.name == "abs":
            each(lambda o, p: isa.tensor_scalar(dst=o, data=p, op0=_nl().abs_max, operand0=0.0), d, src)
        elif op.name == "negative":
            each(lambda o, p: isa.tensor_scalar(dst=o, data=p, op0=_nl().multiply, operand0=-1.0), d, src)
        elif op.name == "invert":
            each(lambda o, p: isa.tensor_scalar(dst=o, data=p, op0=_nl().bitwise_xor, operand0=-1), d, src)
        elif op.name == "logical_not":
            each(lambda o, p: isa.tensor_scalar(dst=o, data=p, op0=_nl().equal, operand0=0.0), d, src)
        else:
            raise NotImplementedError(f"not supported: nl.{op.name} as a one-argument tile function")
    for_boxes(mask, body)
    return dst


class Skipped:
    """The result of an instruction a mask=False skipped: assigning or
    adding it changes nothing."""


SKIPPED = Skipped()


class LoopReduce:
    """nl.loop_reduce(x, op): assigned to a destination, dst = op(dst, x)."""

    def __init__(self, x, op, dtype=None):
        self.x, self.op, self.dtype = x, op, dtype


def assign(dst, value):
    """dst[...] = value: a copy (cast to dst's dtype), a fill, or a matmul
    written straight into a PSUM view."""
    isa = _isa()
    if value is SKIPPED:
        return
    if isinstance(value, LoopReduce):
        if _pending(value.x) and dst.buffer is T.psum and value.op.alu == "add":
            value.x.emit_into(dst, accumulate=None)
        else:
            binary(value.op, dst, value.x, dtype=dst.dtype, dst=dst)
        return
    if isinstance(value, (int, float)):
        isa.memset(dst=dst, value=value)
        return
    if _pending(value):
        value.emit_into(dst, accumulate=False)
        return
    if not isinstance(value, T.NkiTensor):
        raise TypeError(f"cannot assign {type(value).__name__} to a tile")
    from tern.nki import _hoist
    if _hoist.take(dst, value):
        return  # the instruction computing value wrote dst itself
    if value._base is dst._base and _same_view(value, dst):
        return  # t[...] += x wrote it in place already
    if value.shape != dst.shape:
        value = fit(value, dst.shape, engines=not dst.is_hbm)
    try:
        if dst.is_hbm or value.is_hbm:
            each(lambda o, p: isa.dma_copy(dst=o, src=p), dst, value)
        else:
            each(lambda o, p: isa.tensor_copy(dst=o, src=p), dst, value)
    except T.Empty:
        pass


def _same_view(a, b):
    try:
        return repr(a._tensor()) == repr(b._tensor())
    except T.Empty:
        return True


def inplace(op, dst, value):
    """dst op= value (dst += x accumulates a matmul into PSUM)."""
    nl = _nl()
    if value is SKIPPED:
        return dst
    if _as_op(op) is nl.add and _pending(value) and dst.buffer is T.psum:
        # The first matmul into a PSUM region overwrites it (the compiler's
        # accumulation group), later ones accumulate.
        value.emit_into(dst, accumulate=None)
        return dst
    binary(op, dst, value, dtype=dst.dtype, dst=dst)
    return dst


# ------------------------------------------------------------ reductions
def _axes(axis, ndim):
    if axis is None:
        return list(range(1, ndim))
    axes = [axis] if isinstance(axis, int) else list(axis)
    return sorted(a % ndim for a in axes)


def reduce(op, x, axis, dtype=None, keepdims=False, mask=None, negate=False, dst=None):
    """op over the given free axes (tensor_reduce), or over the partitions
    (axis 0 alone: tensor_partition_reduce on GpSimd)."""
    isa = _isa()
    op = _as_op(op)
    if op.name in ("all", "any"):  # whether all / any elements are non-zero: 0 / 1 before min / max
        from tern.nki import language as nl
        x = binary(nl.not_equal, x, 0.0, dtype="float32", mask=mask)
    axes = _axes(axis, x.ndim)
    boxes = mask_boxes(mask)
    if len(boxes) > 1 and 0 not in axes:
        return _reduce_boxes(op, x, axes, boxes, dtype, keepdims, negate, dst)
    try:
        if not boxes:
            raise T.Empty()
        ranges = boxes[0]
        src = restrict(x, ranges)
    except T.Empty:
        ranges, src = None, None
    if axes == [0]:
        shape = (1,) + x.shape[1:]
        dst = dst if dst is not None else new_tile(shape, dtype or x.dtype)
        if src is not None:
            isa.tensor_partition_reduce(dst=dst, op=op, data=src)
        return dst
    if 0 in axes:
        raise NotImplementedError("not supported: a reduction over the partition dim and free dims together")
    keep = [d for d in range(1, x.ndim) if d not in axes]
    kept_shape = [x.shape[d] for d in keep]
    shape = (x.shape[0],) + (tuple(1 if d in axes else x.shape[d] for d in range(1, x.ndim)) if keepdims
                             else (tuple(kept_shape) or (1,)))
    if dst is None:
        dst = _reduce_dst(x, axes, keepdims, dtype)
    if src is None:
        return dst
    full = dst  # the caller gets the whole tile; the mask's part is written
    if ranges:
        dst = restrict(dst, ranges)
        kept_shape = [src.shape[d] for d in keep]
    # One instruction per combination of the kept dims (tern's tensor_reduce
    # reduces every free dim of its source).
    for idx in _product(kept_shape):
        key, dkey, it = [slice(None)] * x.ndim, [slice(None)], iter(idx)
        for d in range(1, x.ndim):
            if d in axes:
                dkey += [0] if keepdims else []
            else:
                key[d] = dkey_v = next(it)
                dkey.append(dkey_v)
        for d, v in zip(keep, idx):
            key[d] = v
        part = src[tuple(key)]
        out = dst[tuple(dkey)] if len(dkey) > 1 and (keepdims or keep) else dst
        isa.tensor_reduce(dst=out, op=op, data=part, axis=list(range(1, part.ndim)) or [1], negate=negate)
    return full


def _reduce_dst(x, axes, keepdims, dtype):
    """A new tile for a reduction of x over free `axes`, carrying the kept
    dims' index variables (masks match them)."""
    keep = [d for d in range(1, x.ndim) if d not in axes]
    shape = (x.shape[0],) + (tuple(1 if d in axes else x.shape[d] for d in range(1, x.ndim)) if keepdims
                             else (tuple(x.shape[d] for d in keep) or (1,)))
    dst = new_tile(shape, dtype or x.dtype)
    if x._vars:
        dst._vars = [x._vars[0]] + ([x._vars[d] if d not in axes else None for d in range(1, x.ndim)]
                                    if keepdims else [x._vars[d] for d in keep])
    return dst


_IDENTITY = {"max": -3.4028234663852886e38, "min": 3.4028234663852886e38, "add": 0.0, "multiply": 1.0}


def _reduce_boxes(op, x, axes, boxes, dtype, keepdims, negate, dst):
    """A reduction whose mask keeps several boxes: each box reduced on its
    own, combined into the result with op (which starts at op's identity)."""
    if negate or op.alu not in _IDENTITY:
        raise NotImplementedError(f"not supported: a {op.name} reduction under a mask of several boxes")
    isa = _isa()
    whole = dst if dst is not None else _reduce_dst(x, axes, keepdims, dtype)
    isa.memset(dst=whole, value=_IDENTITY[op.alu])
    for box in boxes:
        part = reduce(op, x, axes, dtype=whole.dtype, keepdims=keepdims, mask=T.Box(box))
        region = restrict(whole, box)
        binary(op, region, restrict(part, box), dtype=whole.dtype, dst=region)
    return whole


def _product(shape):
    if not shape:
        yield ()
        return
    for i in range(shape[0]):
        for rest in _product(shape[1:]):
            yield (i,) + rest


# ------------------------------------------------------------ tensor engine
def transpose(x, dtype=None, mask=None):
    """x [P, F] -> PSUM [F, P] on the Tensor engine (Vector for <= 32 x 32)."""
    isa = _isa()
    src = _sbuf_operand(x) if x.buffer is T.psum else x
    src2 = src.reshape((src.shape[0], math.prod(src.shape[1:]))) if src.ndim > 2 else src
    out = new_tile((src2.shape[1], src2.shape[0]), dtype or x.dtype, T.psum)
    isa.nc_transpose(dst=out, data=src2)
    return out


class LazyMatmul(T.NkiTensor):
    """nl.matmul's PSUM result: issued when first read, or straight into the
    PSUM view it is added to (psum[...] += nl.matmul(...))."""

    def __init__(self, stationary, moving, dtype="float32", perf_mode=None):
        double = perf_mode is not None and str(getattr(perf_mode, "value", perf_mode)).startswith("double_row")
        # The Tensor engine reads SBUF: a PSUM operand is copied there first.
        stationary, moving = _sbuf_operand(stationary), _sbuf_operand(moving)
        m = stationary.size // stationary.shape[0] // (2 if double else 1)
        n = moving.size // moving.shape[0] // (2 if double else 1)
        tile = new_tile((m, n), dtype, T.psum)
        super().__init__(tile._base, tile.buffer, tile.dtype, tile._p0, tile._np, tile._off, tile._free,
                         tile.name, tile._row_stride, tile._alloc)
        self._pending = (stationary, moving, perf_mode)

    def emit_into(self, dst, accumulate):
        st, mv, perf = self._pending
        self._pending = None
        _isa().nc_matmul(dst=dst, stationary=st, moving=mv, accumulate=accumulate, perf_mode=perf)

    def _tensor(self):
        if self._pending is not None:
            st, mv, perf = self._pending
            self._pending = None
            whole = T.NkiTensor(self._base, self.buffer, self.dtype, self._p0, self._np, self._off,
                                self._free, self.name, self._row_stride, self._alloc)
            _isa().nc_matmul(dst=whole, stationary=st, moving=mv, accumulate=False, perf_mode=perf)
        return super()._tensor()


def matmul(x, y, transpose_x=False, mask=None):
    """x @ y into PSUM (FP32): x is [K, M] with transpose_x=True, else [M, K]
    (transposed on the Tensor engine first)."""
    if not transpose_x:
        xt = transpose(x)
        xs = new_tile(xt.shape, x.dtype)
        _isa().tensor_copy(dst=xs, src=xt)
        x = xs
    return LazyMatmul(x, y)
