"""neuronxcc.nki.isa (the legacy NKI generation) for tern: the same
instructions as tern.nki.isa, called without `dst`: each returns a new tile
(dtype= picks its type, NKI's promotion otherwise) and takes mask= (the
elements it computes). Matmuls return PSUM results that `psum += ...`
accumulates."""
from tern import _core
from tern.nki import _functions as F
from tern.nki import _hoist
from tern.nki import _tensor as T
from tern.nki import _tracer
from tern.nki import isa as cur
from tern.nki import language as nl
from tern.nki.isa_enums import (dge_mode, engine, fp32, matmul_perf_mode, nc_version, oob_mode,  # noqa: F401
                                reduce_cmd)
from tern.nki import isa_enums as constants  # noqa: F401

tensor_engine, vector_engine, scalar_engine = cur.tensor_engine, cur.vector_engine, cur.scalar_engine
gpsimd_engine, unknown_engine = cur.gpsimd_engine, cur.unknown_engine
get_nc_version = cur.get_nc_version


def _tile(x):
    return isinstance(x, T.NkiTensor)


def _new(shape, dtype, buffer=None):
    return F.new_tile(tuple(shape), dtype, buffer)


def _masked(mask, dst, *operands):
    """dst and the operands of dst's shape restricted to what mask keeps."""
    ranges = F.mask_ranges(mask)
    if not ranges:
        return (dst,) + operands
    out = [F.restrict(dst, ranges)]
    for o in operands:
        out.append(F.restrict(o, ranges) if _tile(o) and o.shape == dst.shape else o)
    return tuple(out)


def _run(call, dst, mask, operands, **kw):
    """Calls the current-generation instruction on the masked views (once
    per box of indices the mask keeps)."""
    for ranges in F.mask_boxes(mask):
        try:
            views = _masked(T.Box(ranges) if ranges else None, dst, *operands)
            call(*views, **kw)
        except T.Empty:
            pass
    return dst


def _result(name, call, dst, mask, operands, params=(), engine=None):
    """A new tile computed by one instruction: with a mask, issued now;
    else hoisted out of the loop when loop-invariant, or held so that an
    assignment into a view writes the view (_hoist.py)."""
    if mask is not None:
        return _run(call, dst, mask, operands)
    return _hoist.issue(name, dst, operands, params, lambda d: _run(call, d, None, operands), engine)


# ------------------------------------------------------------- elementwise
def tensor_tensor(data1, data2, op, dtype=None, mask=None, engine=None, **hints):
    dst = _new(F._result_shape(data1, data2), dtype or F.promote(data1.dtype, data2.dtype))
    a, b = F.fit(data1, dst.shape), F.fit(data2, dst.shape)
    if a.buffer is T.psum and b.buffer is T.psum:
        b = F._sbuf_operand(b)  # two partition broadcasts: at most one PSUM input
    return _result("tensor_tensor", lambda d, x, y: cur.tensor_tensor(dst=d, data1=x, data2=y, op=op, engine=engine),
                   dst, mask, (a, b), (op, engine), cur._engine(engine, _core.Engine.vector))


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, dtype=None,
                  mask=None, engine=None, **hints):
    dst = _new(data.shape, dtype or data.dtype)
    return _result("tensor_scalar",
                   lambda d, x: cur.tensor_scalar(dst=d, data=x, op0=op0, operand0=operand0, reverse0=reverse0,
                                                  op1=op1, operand1=operand1, reverse1=reverse1, engine=engine),
                   dst, mask, (data,), (op0, operand0, reverse0, op1, operand1, reverse1, engine),
                   cur._engine(engine, _core.Engine.vector))


def activation(op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, dtype=None, **hints):
    dst = _new(data.shape, dtype or data.dtype)
    call = lambda d, x: cur.activation(dst=d, op=op, data=x, bias=bias, scale=scale,  # noqa: E731
                                       reduce_op=reduce_op, reduce_res=reduce_res, reduce_cmd=reduce_cmd)
    if reduce_res is not None:  # the row sums are written too: issued now
        return _run(call, dst, mask, (data,))
    return _result("activation", call, dst, mask, (data,), (op, bias, scale), _core.Engine.scalar)


def activation_reduce(op, data, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, **hints):
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, mask=mask, dtype=dtype)


def tensor_copy(src, dtype=None, mask=None, engine=None, **hints):
    dst = _new(src.shape, dtype or src.dtype)
    return _result("tensor_copy", lambda d, x: cur.tensor_copy(dst=d, src=x, engine=engine), dst, mask, (src,),
                   (engine,), cur._engine(engine, _core.Engine.vector))


def reciprocal(data, dtype=None, mask=None, **hints):
    dst = _new(data.shape, dtype or data.dtype)
    return _result("reciprocal", lambda d, x: cur.reciprocal(dst=d, data=x), dst, mask, (data,), (),
                   _core.Engine.vector)


def scalar_tensor_tensor(data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None, mask=None,
                         **hints):
    dst = _new(data.shape, dtype or F.promote(data.dtype, operand1.dtype))
    return _result("scalar_tensor_tensor",
                   lambda d, x, y: cur.scalar_tensor_tensor(dst=d, data=x, op0=op0, operand0=operand0, op1=op1,
                                                            operand1=y, reverse0=reverse0, reverse1=reverse1),
                   dst, mask, (data, operand1), (op0, operand0, op1, reverse0, reverse1), _core.Engine.vector)


def tensor_scalar_reduce(data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         **hints):
    dst = _new(data.shape, dtype or data.dtype)
    return _run(lambda d, x: cur.tensor_scalar_reduce(dst=d, data=x, op0=op0, operand0=operand0,
                                                      reduce_op=reduce_op, reduce_res=reduce_res,
                                                      reverse0=reverse0), dst, mask, (data,))


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, dtype=None, mask=None,
                       **hints):
    dst = _new(data0.shape, dtype or F.promote(data0.dtype, data1.dtype))
    return _result("tensor_tensor_scan",
                   lambda d, a, b: cur.tensor_tensor_scan(dst=d, data0=a, data1=b, initial=initial, op0=op0, op1=op1,
                                                          reverse0=reverse0, reverse1=reverse1),
                   dst, mask, (data0, data1), (initial, op0, op1, reverse0, reverse1), _core.Engine.vector)


def tensor_reduce(op, data, axis, negate=False, keepdims=False, mask=None, dtype=None, **hints):
    ranges = F.mask_ranges(mask)
    return F.reduce(op, data, axis, dtype=dtype, keepdims=keepdims, negate=negate,
                    mask=None if not ranges else mask)


def tensor_partition_reduce(op, data, mask=None, dtype=None, **hints):
    return F.reduce(op, data, 0, dtype=dtype)


def tensor_copy_predicated(src, dst, predicate, reverse_pred=False, mask=None, dtype=None, **hints):
    cur.tensor_copy_predicated(dst=dst, src=src, predicate=predicate, reverse_pred=reverse_pred)
    return dst


def memset(shape, value, dtype=None, mask=None, engine=None, **hints):
    dst = _new(shape, nl._dtype_name(dtype or nl.float32))
    return _run(lambda d: cur.memset(dst=d, value=value, engine=engine), dst, mask, ())


def bn_stats(data, mask=None, dtype=None, **hints):
    dst = _new((data.shape[0], 6), dtype or nl.float32)
    try:
        ranges = F.mask_ranges(mask)
        cur.bn_stats(dst=F.restrict(dst, {u: r for u, r in (ranges or {}).items() if r[0].axis == 0}),
                     data=F.restrict(data, ranges))
    except T.Empty:
        pass
    return dst


def bn_aggr(data, mask=None, dtype=None, **hints):
    dst = _new((data.shape[0], 2), dtype or nl.float32)
    return _run(lambda d, x: cur.bn_aggr(dst=d, data=x), dst, None, (data,))


# ------------------------------------------------------------- tensor engine
def nc_matmul(stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, perf_mode=None, **hints):
    """PSUM [M, N] = stationary[K, M].T @ moving[K, N] (FP32); added into a
    PSUM tile with +=, it accumulates there."""
    try:
        if F.mask_ranges(mask):
            raise NotImplementedError("not supported: nisa.nc_matmul with a mask predicate; slice the operands")
    except T.Empty:
        return F.SKIPPED
    if is_transpose:
        return F.transpose(stationary)
    return F.LazyMatmul(cur._flat2(stationary), cur._flat2(moving), perf_mode=perf_mode)


def nc_transpose(data, mask=None, dtype=None, engine=None, **hints):
    e = cur._engine(engine, None)
    if e is None or e == cur._CORE_ENGINE[cur.engine.tensor]:
        out = F.transpose(data)
        return out if dtype in (None, out.dtype) else tensor_copy(out, dtype=dtype)
    dst = _new((data.shape[1], data.shape[0]), dtype or data.dtype)
    cur.nc_transpose(dst=dst, data=data, engine=engine)
    return dst


def dma_transpose(src, axes=None, mask=None, dtype=None, **hints):
    dst = _new((src.shape[-1], src.size // src.shape[-1]), src.dtype)
    cur.dma_transpose(dst=dst, src=src, axes=axes)
    return dst


def dma_copy(dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, **hints):
    for ranges in F.mask_boxes(mask):
        try:
            d, s = _masked(T.Box(ranges) if ranges else None, dst, src)
            cur.dma_copy(dst=d, src=s, dst_rmw_op=dst_rmw_op, oob_mode=oob_mode, dge_mode=dge_mode)
        except T.Empty:
            pass


# --------------------------------------------------- index-expression forms
def _affine(expr, what):
    """offset, channel multiplier and [[step, count], ...] of an affine index
    expression over a partition index and free indices."""
    e = T.IndexExpr.of(expr)
    if e is None:
        raise TypeError(f"{what} needs an index expression of nl.arange / nl.mgrid indices")
    terms = sorted(e.terms.values(), key=lambda t: t[0].axis)
    part = [t for t in terms if t[0].axis == 0]
    free = [t for t in terms if t[0].axis != 0]
    parts = part[0][0].extent if part else 1
    chan = part[0][1] if part else 0
    pattern = [[c, v.extent] for v, c in free] or [[0, 1]]
    return e.offset, chan, parts, pattern


def iota(expr, dtype, mask=None, **hints):
    """The values of an affine index expression as a tile."""
    offset, chan, parts, pattern = _affine(expr, "iota")
    dst = _new((parts,) + tuple(n for _, n in pattern), dtype)
    cur.iota(dst=dst, pattern=pattern, offset=offset, channel_multiplier=chan)
    return dst


def affine_select(pred, on_true_tile, on_false_value, mask=None, dtype=None, **hints):
    """on_true_tile where the affine predicate holds, else on_false_value."""
    if not isinstance(pred, T.Predicate) or len(pred.conds) != 1:
        raise NotImplementedError("not supported: affine_select with a predicate of several conditions "
                                  "(use nl.where)")
    e, op = pred.conds[0]
    offset, chan, _, pattern = _affine(e, "affine_select")
    cmp = {"lt": nl.less, "le": nl.less_equal, "gt": nl.greater, "ge": nl.greater_equal}[op]
    dst = _new(on_true_tile.shape, dtype or on_true_tile.dtype)
    if on_true_tile.buffer is nl.psum:  # GpSimd reads SBUF: the compiler stages PSUM there
        on_true_tile = tensor_copy(on_true_tile)
    cur.affine_select(dst=dst, pattern=pattern, offset=offset, channel_multiplier=chan,
                      on_true_tile=on_true_tile, on_false_value=on_false_value, cmp_op=cmp)
    return dst


# ------------------------------------------------ selection, search, scan
def sequence_bounds(segment_ids, dtype=None, mask=None, **hints):
    """A new [1, 2, N] tile: each segment id's run start and end (current
    nisa.sequence_bounds)."""
    n = segment_ids.shape[-1]
    dst = _new((1, 2, n), dtype or segment_ids.dtype)
    cur.sequence_bounds(dst=dst, segment_ids=segment_ids)
    return dst


def max8(src, mask=None, dtype=None, **hints):
    dst = _new((src.shape[0], 8), dtype or src.dtype)
    cur.max8(dst=dst, src=src)
    return dst


def nc_find_index8(data, vals, mask=None, dtype=None, **hints):
    dst = _new((data.shape[0], 8), dtype or nl.uint32)
    cur.nc_find_index8(dst=dst, data=data, vals=vals)
    return dst


def nc_match_replace8(data, vals, imm, dst_idx=None, mask=None, dtype=None, **hints):
    dst = _new(data.shape, dtype or data.dtype)
    cur.nc_match_replace8(dst=dst, data=data, vals=vals, imm=imm, dst_idx=dst_idx)
    return dst


def nc_stream_shuffle(src, dst, shuffle_mask, dtype=None, mask=None, **hints):
    cur.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=shuffle_mask)
    return dst


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, mask=None, dtype=None, **hints):
    cur.select_reduce(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd, reduce_op=reduce_op, reverse_pred=reverse_pred)
    return dst


def range_select(on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=None, range_start=0, on_false_value=fp32.min, mask=None, dtype=None, **hints):
    dst = _new(on_true_tile.shape, dtype or on_true_tile.dtype)
    cur.range_select(dst=dst, on_true_tile=on_true_tile, comp_op0=comp_op0, comp_op1=comp_op1, bound0=bound0,
                     bound1=bound1, reduce_res=reduce_res, range_start=range_start, on_false_value=on_false_value)
    return dst


def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, mask=None, **hints):
    per_group = index.size // max(1, index.shape[0] // 16)
    valid = per_group if num_valid_indices is None else int(num_valid_indices)
    dst = _new((src_buffer.shape[0], valid * num_elem_per_idx), src_buffer.dtype)
    cur.local_gather(dst=dst, src_buffer=src_buffer, index=index, num_elem_per_idx=num_elem_per_idx,
                     num_valid_indices=num_valid_indices)
    return dst


def dropout(data, prob, mask=None, dtype=None, **hints):
    dst = _new(data.shape, dtype or data.dtype)
    cur.dropout(dst=dst, data=data, prob=prob)
    return dst


for _name in ("rng", "rand2", "set_rng_seed", "sendrecv", "core_barrier"):
    globals()[_name] = _tracer.not_yet(f"nisa.{_name}")
