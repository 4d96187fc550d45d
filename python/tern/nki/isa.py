"""nki.isa for tern: one simulated instruction per call (a few calls are
two or three; docs/nki.md says which), destination first, with the public
NKI parameter names and enums. Calls tern does not implement raise
NotImplementedError naming the call (see docs/nki.md)."""
import enum
import functools
import itertools

import numpy as np

from tern import _core
from tern.nki import _hoist
from tern.nki import _ops
from tern.nki import _registers
from tern.nki import _tensor as T
from tern.nki import _tracer
from tern.nki import language as nl
from tern.nki.isa_enums import (dge_mode, engine, matmul_perf_mode, nc_version, oob_mode,  # noqa: F401
                                reduce_cmd)
from tern.nki import isa_enums as constants  # noqa: F401  (nki.isa.constants)

tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, sync_engine, dma_engine, unknown_engine = engine.gpsimd, engine.sync, engine.dma, engine.unknown

_CORE_ENGINE = {engine.tensor: _core.Engine.tensor, engine.vector: _core.Engine.vector,
                engine.scalar: _core.Engine.scalar, engine.gpsimd: _core.Engine.gpsimd,
                engine.sync: _core.Engine.sync, engine.dma: _core.Engine.sync}


def get_nc_version():
    """The NeuronCore generation of the current target (gen2 trn1, gen3
    trn2, gen4 trn3)."""
    tr = _tracer._current
    chip = tr.chip if tr is not None else _core.load_chip(_tracer.target_name())
    return nc_version(chip.core_version)


_WRITTEN = frozenset(("dst", "dst_scale", "reduce_res"))
# Instructions of _emit that also write their last operand (row sums, indices).
_WRITES_LAST = frozenset(("activation", "exponential", "select_reduce", "range_select", "match_replace8"))


def _t(x, what):
    if not isinstance(x, T.NkiTensor):
        raise TypeError(f"{what} must be an nki tensor, got {type(x).__name__} ({_tracer.kernel_location()})")
    if what in _WRITTEN:
        _hoist.wrote(x)
    return x._tensor()


def _alu(op, what="op"):
    if op is None:
        return _core.alu_op("bypass")
    o = _ops.resolve(op)
    if o.alu is None:
        raise ValueError(f"{what}={op!r} is not an ALU operator (nl.add, nl.multiply, ...)")
    return _core.alu_op(o.alu)


def _is_float(dtype):
    return not str(dtype).startswith(("int", "uint", "bool"))


def _engine(e, default):
    """The simulator engine for `engine=` (None / unknown: the default)."""
    if e is None or e == engine.unknown or e == 0:
        return default
    if isinstance(e, _core.Engine):
        return e
    return _CORE_ENGINE[engine(e)]


from tern.nki._psum_accumulate import auto_accumulate as _auto_accumulate  # noqa: E402


def _noop_when_empty(fn):
    """An operand with no elements (an empty slice): the call does nothing."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except T.Empty:
            return None
    return call


def _column(col, like, what="a tensor operand"):
    """A [P, 1] (or [P]) tensor seen as [P, free...] through stride-0 free dims."""
    if col.shape[0] != like.shape[0] or col.size != col.shape[0]:
        raise ValueError(f"{what} must be a [{like.shape[0]}, 1] column, got {col.shape} "
                         f"({_tracer.kernel_location()})")
    free = [(0, c) for c in like.shape[1:]]
    return col._like(col._p0, col._np, col._off, free)


def _as_col(col):
    """A [P] / [P, 1, ...] column as a [P, 1] view."""
    return col._like(col._p0, col._np, col._off, [(1, 1)])


def _scratch(shape, dtype="float32"):
    return nl.ndarray(tuple(shape), dtype, buffer=nl.sbuf)


def _emit(op, eng, operands, **kw):
    b = _tracer.current().at()
    _hoist.wrote(operands[0])
    if op in _WRITES_LAST:
        _hoist.wrote(operands[-1])
    b.emit_op(op, eng, [o._tensor() for o in operands], **kw)


# ------------------------------------------------------------ data movement
def _indirect(x):
    return getattr(x, "_indirect", None)


@_tracer.status("partial: a PSUM source or destination is staged through SBUF by a Vector copy; dge_mode=hwdge is timed as the hardware DGE's 600 ns, the other modes as descriptors built before the run")
def dma_copy(dst, src, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             unique_indices=True, engine=None, name=None, mask=None):
    """dst <- src (cast through FP32); dst_rmw_op=nl.add accumulates into dst.
    A view with vector_offset / scalar_offset (.ap) gathers or scatters rows
    by indices read from SBUF at run time."""
    if dst_rmw_op is not None and _ops.resolve(dst_rmw_op) is not nl.add:
        raise NotImplementedError(f"not supported: dma_copy(dst_rmw_op={dst_rmw_op!r}): only nl.add "
                                  "(as the hardware)")
    skip = oob_mode is not None and int(oob_mode) == int(globals()["oob_mode"].skip)
    if _tracer.is_hwdge(dge_mode) and (_indirect(src) or _indirect(dst)):
        raise ValueError(f"dma_copy(dge_mode=hwdge): the hardware DGE does not do indirect (gather / "
                         f"scatter) transfers; use swdge ({_tracer.kernel_location()})")
    if _indirect(src) or _indirect(dst):
        from tern.nki import _indirect as ind
        ind.dma(dst, src, dst_rmw_op is not None, skip, _engine(engine, _core.Engine.sync))
        return
    src, dst = _fit_dma(src, dst)
    if src.buffer is nl.psum and dst_rmw_op is None:
        # tern's DMA model moves HBM and SBUF: a PSUM source is copied to SBUF
        # first (one Vector copy, the same bits).
        staged = _scratch(src.shape, src.dtype)
        tensor_copy(dst=staged, src=src)
        src = staged
    if dst.buffer is nl.psum and dst_rmw_op is None:
        staged = _scratch(dst.shape, dst.dtype)
        dma_copy(dst=staged, src=src, oob_mode=oob_mode, dge_mode=dge_mode, engine=engine)
        tensor_copy(dst=dst, src=staged)
        return
    with _tracer.hardware_dge(_tracer.current().at(), dge_mode) as b:
        b.dma_copy(_t(dst, "dst"), _t(src, "src"), -1, dst_rmw_op is not None,
                   _engine(engine, _core.Engine.sync))


def _fit_dma(src, dst):
    """DMA sources and destinations may differ in shape when the element
    counts match ((N,) vs (1, N), (n, 1) vs (n,)): the HBM side is seen in
    the other side's shape."""
    if src.shape == dst.shape or src.size != dst.size or src.shape[0] == dst.shape[0]:
        return src, dst
    if src.is_hbm and src._contiguous():
        return src.reshape(dst.shape), dst
    if dst.is_hbm and dst._contiguous():
        return src, dst.reshape(src.shape)
    raise ValueError(f"dma_copy from {src.shape} into {dst.shape}: the shapes differ in a way tern cannot "
                     f"match row for row ({_tracer.kernel_location()})")


def dma_compute(dst, srcs, reduce_op, scales=None, name=None):
    """dst = srcs[0] + srcs[1] + ... in the DMA engines (FP32 inside); like
    the hardware, only reduce_op=nl.add and scales of 1.0."""
    if _ops.resolve(reduce_op) is not nl.add:
        raise NotImplementedError(f"not supported: dma_compute(reduce_op={reduce_op!r}): only nl.add")
    if scales is not None and any(float(x) != 1.0 for x in scales):
        raise NotImplementedError("not supported: dma_compute with scales other than 1.0 (as the hardware)")
    srcs = list(srcs)
    if not srcs:
        raise ValueError("dma_compute needs at least one source")
    b = _tracer.current().at()
    d = _t(dst, "dst")
    rest = [x for x in srcs if x is not dst]
    if len(rest) == len(srcs):  # dst is not a source: start from the first
        b.dma_copy(d, _t(rest.pop(0), "srcs[0]"), -1, False, _core.Engine.sync)
    for x in rest:
        b.dma_copy(d, _t(x, "srcs"), -1, True, _core.Engine.sync)


# dma_transpose lives in _isa_transpose.
from tern.nki._isa_transpose import dma_transpose  # noqa: E402,F401


# ----------------------------------------------------------------- tensor
@_tracer.status("partial: tile_position / tile_size give the same values, timed as a whole-array matmul")
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=None, name=None, **hints):
    """dst[M, N] (+)= stationary[K, M].T @ moving[K, N] on the Tensor engine.
    accumulate=None accumulates when this PSUM region was written by an
    earlier matmul of the kernel (the first one overwrites). is_transpose:
    the PE array's exact transpose of stationary (moving is the identity).
    tile_position / tile_size place the matmul on a part of the PE array:
    the values are the same (timing as a whole-array matmul)."""
    tr = _tracer.current()
    st, mv = _flat2(stationary), _flat2(moving)
    d = _flat2(dst)
    if is_transpose:
        tr.at().transpose(_t(d, "dst"), _t(st, "stationary"), _core.Engine.tensor)
        return
    dv = _t(d, "dst")
    acc = _auto_accumulate(d, dv, accumulate)
    double = perf_mode is not None and str(getattr(perf_mode, "value", perf_mode)).startswith("double_row")
    tr.at().matmul(dv, _t(st, "stationary"), _t(mv, "moving"), acc, double)


def _flat2(x):
    """A tile seen as [P, F] (its free dims flattened). A view whose free
    dims cannot merge (permuted, strided) keeps them: the engines walk up
    to four free dims in order, which is the flattened element order."""
    if x.ndim == 2:
        return x
    if x.ndim == 1:
        return x._like(x._p0, x._np, x._off, [(1, 1)])
    if not x._contiguous():
        return x
    return x.reshape((x.shape[0], x.size // x.shape[0]))


def _mx_groups(data_rows):
    """The partitions of a [P, F] scale tile holding the scales of MX groups
    0, 1, ... (8 data partitions a group): four rows at the start of each
    32-partition quadrant (0:4, 32:36, 64:68, 96:100), as NKI lays them out."""
    return [(g // 4) * 32 + g % 4 for g in range(data_rows // 8)]


def _mx_scale_in(scale, data):
    """A [P/8, F] view of MX scales given [P/8, F] or in NKI's quadrant
    layout in a [P, F] tile (gathered by SBUF-to-SBUF DMAs)."""
    groups = data.shape[0] // 8
    rows = _mx_groups(data.shape[0])
    if scale.shape[0] == groups or scale.shape[0] <= rows[-1]:
        return scale  # packed [P/8, F] (other shapes: the rule check says what is wrong)
    # The quadrant layout, counted from the view's first partition (a kernel
    # may keep two operands' scales in one tile: rows 0:4 and 4:8 of each quadrant).
    packed = _scratch((groups, scale.size // scale.shape[0]), scale.dtype)
    for q in range(0, groups, 4):
        n = min(4, groups - q)
        dma_copy(dst=packed[q:q + n], src=_flat2(scale)[_mx_groups(data.shape[0])[q]:][0:n])
    return packed


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """MX matmul (trn3): x4-packed data with E8M0 scales, [P/8, F] or in
    NKI's [P, F] quadrant layout (rows 0:4, 32:36, ... of the tile)."""
    stationary_scale = _mx_scale_in(stationary_scale, stationary)
    moving_scale = _mx_scale_in(moving_scale, moving)
    tr = _tracer.current()
    d = dst if dst.ndim == 2 else dst.reshape((dst.shape[0], dst.size // dst.shape[0]))
    dv = _t(d, "dst")
    acc = _auto_accumulate(d, dv, accumulate)
    tr.at().matmul_mx(dv, _t(stationary, "stationary"), _t(stationary_scale, "stationary_scale"),
                      _t(moving, "moving"), _t(moving_scale, "moving_scale"), acc)


def nc_transpose(dst, data, engine=None, name=None):
    """Tensor engine (<= 128 x 128, into PSUM) or Vector engine (<= 32 x 32)."""
    default = _core.Engine.tensor if dst.buffer is nl.psum else _core.Engine.vector
    _tracer.current().at().transpose(_t(_flat2(dst), "dst"), _t(_flat2(data), "data"), _engine(engine, default))


# ------------------------------------------------------- vector / scalar
def tensor_tensor(dst, data1, data2, op, engine=None, name=None, **hints):
    """dst = data1 op data2 elementwise (Vector; GpSimd with engine=)."""
    _tracer.current().at().tensor_tensor(_t(dst, "dst"), _t(data1, "data1"), _t(data2, "data2"), _alu(op),
                                         _engine(engine, _core.Engine.vector))


def _is_tile(x):
    return isinstance(x, T.NkiTensor)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None, **hints):
    """(data op0 operand0) op1 operand1; operands are scalars or [P, 1]
    columns; reverse0 / reverse1 put the operand first (operand op data)."""
    eng = _engine(engine, _core.Engine.vector)
    b = _tracer.current().at()
    big = [isinstance(v, int) and not isinstance(v, bool) and float(_f32(v)) != v for v in (operand0, operand1)]
    if any(big):
        if data.dtype not in ("int32", "uint32"):
            raise NotImplementedError(f"not supported: an integer operand beyond float32's exact range on "
                                      f"{data.dtype} data ({_tracer.kernel_location()})")
        # tern's immediates are float32: the value goes in as an exact [P, 1]
        # integer column, built from its 16-bit halves (three instructions).
        operand0 = _int_column(operand0, data) if big[0] else operand0
        operand1 = _int_column(operand1, data) if big[1] else operand1
    tensors = _is_tile(operand0) or _is_tile(operand1)
    if not tensors and not (reverse0 or reverse1):
        b.tensor_scalar(_t(dst, "dst"), _t(data, "data"), _alu(op0, "op0"), float(operand0), _alu(op1, "op1"),
                        0.0 if operand1 is None else float(operand1), eng)
        return
    if not tensors:
        _emit("tensor_scalar", eng, [dst, data], alu0=_alu(op0, "op0"), alu1=_alu(op1, "op1"),
              imm0=float(operand0), imm1=0.0 if operand1 is None else float(operand1), rev0=bool(reverse0),
              rev1=bool(reverse1))
        return
    cols = [v for v in (operand0, operand1) if _is_tile(v)]
    if _is_float(data.dtype) and all(_is_float(c.dtype) for c in cols):
        # One instruction, as the hardware's: each stage's operand an
        # immediate or a per-partition column (col0 / col1), the value kept
        # in FP32 between the stages.
        kw = dict(alu0=_alu(op0, "op0"), alu1=_alu(op1, "op1"), rev0=bool(reverse0), rev1=bool(reverse1),
                  col0=_is_tile(operand0), col1=_is_tile(operand1))
        if not _is_tile(operand0):
            kw["imm0"] = float(operand0)
        if op1 is not None and not _is_tile(operand1):
            kw["imm1"] = float(operand1)
        _emit("tensor_scalar", eng, [dst, data] + [_as_col(c) for c in cols], **kw)
        return
    # Integer data: one instruction per stage against the column.
    for i, (op, operand, rev) in enumerate(((op0, operand0, reverse0), (op1, operand1, reverse1))):
        if op is None:
            break
        src = data if i == 0 else dst
        if _is_tile(operand):
            if rev:
                _emit("tensor_scalar", eng, [dst, src, _as_col(operand)], alu0=_alu(op), col0=True, rev0=True)
            else:
                b.tensor_tensor(_t(dst, "dst"), _t(src, "data"), _column(operand, dst)._tensor(), _alu(op),
                                eng if eng != _core.Engine.scalar else _core.Engine.vector)
        else:
            _emit("tensor_scalar", eng, [dst, src], alu0=_alu(op), imm0=float(operand), rev0=bool(rev))


def _int_column(value, like):
    """A [P, 1] tile of like's 32-bit integer type holding `value` exactly."""
    col = _scratch((like.shape[0], 1), like.dtype)
    bits = int(value) & 0xFFFFFFFF
    memset(dst=col, value=float(bits >> 16))
    tensor_scalar(dst=col, data=col, op0=nl.left_shift, operand0=16, op1=nl.bitwise_or,
                  operand1=bits & 0xFFFF)
    return col


def _f32(v):
    import numpy as np
    return np.float32(v)


def tensor_copy(dst, src, engine=None, name=None, dtype=None, **hints):
    """dst = src (bit-exact for equal dtypes, else through FP32)."""
    _tracer.current().at().tensor_copy(_t(dst, "dst"), _t(src, "src"), _engine(engine, _core.Engine.vector))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, dtype=None):
    """Reduces the innermost free dims of data (as many as `axis` names:
    NKI's axes count from the most minor free dim) into dst."""
    from tern.nki import _functions as F
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    k = len(axes)
    if not 1 <= k < data.ndim + (1 if data.ndim == 1 else 0):
        raise ValueError(f"tensor_reduce(axis={axis}) on a {data.ndim}-d tile ({_tracer.kernel_location()})")
    if data.ndim == 1:
        data = _as_col(data)
    reduced = list(range(data.ndim - k, data.ndim))
    if reduced == list(range(1, data.ndim)):
        _tracer.current().at().tensor_reduce(_t(_as_col(dst), "dst"), _t(data, "data"), _alu(op), bool(negate))
        return
    kept = [data.shape[d] for d in range(1, data.ndim - k)]
    flat = dst.reshape((dst.shape[0],) + tuple(kept)) if dst.size == dst.shape[0] * _prod(kept) else dst
    F.reduce(op, data, reduced, keepdims=False, negate=negate, dst=flat)


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def memset(dst, value, engine=None, name=None, **hints):
    _tracer.current().at().memset(_t(dst, "dst"), float(value), _engine(engine, _core.Engine.vector))


@_tracer.status("partial: reduce_cmd load_reduce not yet")
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, engine=None, name=None, dtype=None, **hints):
    """dst = op(data * scale + bias) on the Scalar engine; reduce_res gets
    the row sums. bias: a [P, 1] column or a scalar; scale: a scalar or a
    [P, 1] column (one per partition, as the hardware). reduce_cmd keeps
    sums across instructions (the engine's reduce registers)."""
    o = _ops.resolve(op)
    if o is None or o.act is None:
        raise ValueError(f"op={op!r} is not an activation function (nl.exp, nl.gelu, ...)")
    if reduce_op is not None and _ops.resolve(reduce_op).alu != "add":
        raise NotImplementedError(f"not supported: activation(reduce_op={reduce_op!r}): only nl.add "
                                  "(as the hardware)")
    rows = data.shape[0]
    src = data
    scale_col = None
    if _is_tile(scale):  # per-partition scale: the instruction's col0 operand
        _column(scale, data, "scale")  # shape check
        scale_col, scale = _as_col(scale), 1.0
    if bias is not None and not _is_tile(bias):
        value = float(bias)  # a scalar bias: a constant [P, 1] column
        bias = _scratch((rows, 1))
        memset(dst=bias, value=value)
    if int(reduce_cmd) == int(globals()["reduce_cmd"].load_reduce):
        raise NotImplementedError("not supported: nisa.activation(reduce_cmd=load_reduce)")
    code = _register_code(reduce_cmd, reduce_res)
    ops = [_flat2(dst), _flat2(src)] + ([scale_col] if scale_col is not None else [])
    ops += [_as_col(bias)] if bias is not None else []
    if reduce_res is not None:
        ops.append(_as_col(reduce_res))
    _emit("activation", _core.Engine.scalar, ops, func=_core.act_func(o.act), scale=float(scale),
          imm2=float(code), acc=reduce_res is not None, col0=scale_col is not None)


def _register_code(cmd, reduce_res):
    """An engine's accumulator registers under NKI's reduce_cmd, as the
    simulator's code (imm2): 0 this instruction's values, 1 reset, 2
    combine, 3 keep, 4 load the initial value then combine. reduce_res with
    the default idle command gets this instruction's values."""
    rc = globals()["reduce_cmd"]
    code = {int(rc.reset_reduce): 0, int(rc.reset): 1, int(rc.reduce): 2, int(rc.idle): 3,
            int(rc.load_reduce): 4}[int(cmd)]
    return 0 if code == 3 and reduce_res is not None else code


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, **hints):
    """activation with its row reduction (reduce_op nl.add) in one Scalar instruction."""
    activation(dst=dst, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, engine=None,
                         name=None, **hints):
    """(data op0 operand0) op1 operand1 in FP32, one Vector instruction
    (rounded once into dst); operand0 is a scalar or a [P, 1] column,
    operand1 a tile of data's shape; reverse0 / reverse1 put the operand
    first."""
    eng = _engine(engine, _core.Engine.vector)
    col = _is_tile(operand0)
    if col and not _is_float(operand0.dtype):
        raise NotImplementedError(f"not supported: scalar_tensor_tensor with a {operand0.dtype} operand0 "
                                  f"column (float columns are) ({_tracer.kernel_location()})")
    kw = dict(alu0=_alu(op0, "op0"), alu1=_alu(op1, "op1"), rev0=bool(reverse0), rev1=bool(reverse1), col0=col)
    if not col:
        kw["imm0"] = float(operand0)
    _emit("scalar_tensor_tensor", eng, [dst, data, operand1] + ([_as_col(operand0)] if col else []), **kw)


@_tracer.status("partial: issued as two Vector instructions (same values, the time of two)")
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=False, name=None, **hints):
    """tensor_scalar with one operator, then a reduction of the result over the
    free dims into reduce_res; tern issues two Vector instructions."""
    tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0, reverse0=reverse0)
    _tracer.current().at().tensor_reduce(_t(_as_col(reduce_res), "reduce_res"), _t(_flat2(dst), "dst"),
                                         _alu(reduce_op), False)


def reciprocal(dst, data, name=None, **hints):
    _tracer.current().at().reciprocal(_t(dst, "dst"), _t(data, "data"))


def exponential(dst, src, max_value=None, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0,
                name=None):
    """dst = exp(src - max_value) (trn3 Vector engine); the row sums go to
    the Vector accumulators by reduce_cmd (load_reduce starts from
    reduce_init) and to reduce_res."""
    if max_value is not None and not _is_tile(max_value):
        v = float(max_value)
        max_value = None
        if v != 0.0:
            max_value = _scratch((src.shape[0], 1))
            memset(dst=max_value, value=v)
    ops = [_flat2(dst), _flat2(src)] + ([_as_col(max_value)] if max_value is not None else [])
    if reduce_res is not None:
        ops.append(_as_col(reduce_res))
    _emit("exponential", _core.Engine.vector, ops, imm2=float(_register_code(reduce_cmd, reduce_res)),
          imm3=float(reduce_init), acc=reduce_res is not None)


def bn_stats(dst, data, name=None, **hints):
    _tracer.current().at().bn_stats(_t(_flat2(dst), "dst"), _t(_flat2(data), "data"))


def bn_aggr(dst, data, name=None, **hints):
    _tracer.current().at().bn_aggr(_t(_flat2(dst), "dst"), _t(_flat2(data), "data"))


@_tracer.status("supported (reverse_pred is one extra Vector instruction)")
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None, **hints):
    """dst = src where predicate is non-zero (zero with reverse_pred)."""
    if reverse_pred:
        inv = _scratch(predicate.shape, predicate.dtype)
        tensor_scalar(dst=inv, data=predicate, op0=nl.equal, operand0=0.0)
        predicate = inv
    if not _is_tile(src):
        value = float(src)
        src = _scratch(dst.shape, dst.dtype)
        memset(dst=src, value=value)
    _tracer.current().at().copy_predicated(_t(dst, "dst"), _t(predicate, "predicate"), _t(src, "src"))


def quantize_mx(dst, src, dst_scale, name=None):
    """BF16/FP16 src [P, F] -> x4 FP8 dst [P, F/4] and E8M0 dst_scale [P/8, F/4]
    (trn3 scales); a [P, F/4] dst_scale gets NKI's quadrant layout (the
    scales scattered by SBUF-to-SBUF DMAs)."""
    groups = src.shape[0] // 8
    if dst_scale.shape[0] != groups and dst_scale.shape[0] > _mx_groups(src.shape[0])[-1]:
        packed = _scratch((groups, dst_scale.size // dst_scale.shape[0]), dst_scale.dtype)
        _tracer.current().at().quantize_mx(_t(dst, "dst"), _t(packed, "dst_scale"), _t(src, "src"))
        rows = _mx_groups(src.shape[0])
        for q in range(0, groups, 4):
            n = min(4, groups - q)
            dma_copy(dst=_flat2(dst_scale)[rows[q]:][0:n], src=packed[q:q + n])
        return
    _tracer.current().at().quantize_mx(_t(dst, "dst"), _t(dst_scale, "dst_scale"), _t(src, "src"))


def tensor_partition_reduce(dst, op, data, name=None):
    _tracer.current().at().partition_reduce(_t(dst, "dst"), _t(data, "data"), _alu(op))


def _linear_step(pattern, dst, call):
    """The per-element step of an affine pattern [[step, num], ...] that is
    linear in the flat free index (each step = the inner step x inner count)."""
    dims = [(int(s), int(n)) for s, n in pattern]
    total = _prod(n for _, n in dims)
    free = _prod(dst.shape[1:])
    if total != free:
        raise ValueError(f"{call}: the pattern covers {total} elements per partition, dst has {free}")
    live = [(s, n) for s, n in dims if n != 1]
    step = live[-1][0] if live else 0
    for (s_out, _), (s_in, n_in) in zip(live, live[1:]):
        if s_out != s_in * n_in:
            raise NotImplementedError(f"not supported: {call} with a pattern that is not linear in the flat "
                                      f"index: {pattern}")
    return step


def _iota_planes(dst, dims, offset, channel_multiplier):
    """A pattern whose steps do not nest: one iota along its longest dim for
    each index of the others, into strided views of dst."""
    keep = max(range(len(dims)), key=lambda d: dims[d][1])
    view = _flat2(dst)
    view = view.reshape((view.shape[0],) + tuple(n for _, n in dims))
    for idx in itertools.product(*(range(n) if d != keep else (None,) for d, (_, n) in enumerate(dims))):
        sub = view[(slice(None),) + tuple(slice(None) if i is None else i for i in idx)]
        off = offset + sum(dims[d][0] * i for d, i in enumerate(idx) if i is not None)
        iota(dst=sub, pattern=[list(dims[keep])], offset=off, channel_multiplier=channel_multiplier)


@_tracer.status("partial: a pattern whose steps do not nest is issued as one iota per index of its other dims")
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None, **hints):
    """dst[c, i...] = offset + c * channel_multiplier + sum(step_d * i_d) on GpSimd.
    A pattern with zero steps (values repeating along a dim) is an iota of
    the stepping dims and a copy that repeats it (two instructions)."""
    dims = [(int(s), int(n)) for s, n in pattern]
    try:
        step = _linear_step(pattern, dst, "iota")
    except NotImplementedError:
        moving = [(s, n) for s, n in dims if s != 0 and n != 1]
        if not moving or len(moving) == len([d for d in dims if d[1] != 1]):
            _iota_planes(dst, dims, offset, channel_multiplier)
            return
        tmp = _scratch((dst.shape[0], _prod(n for _, n in moving)), dst.dtype)
        iota(dst=tmp, pattern=moving, offset=offset, channel_multiplier=channel_multiplier)
        strides, acc = {}, 1
        for i in reversed(range(len(dims))):
            s, n = dims[i]
            if s != 0 and n != 1:
                strides[i] = acc
                acc *= n
        src = tmp._like(tmp._p0, tmp._np, tmp._off, [(strides.get(i, 0), n) for i, (_, n) in enumerate(dims)])
        view = _flat2(dst)
        tensor_copy(dst=view.reshape((view.shape[0],) + tuple(n for _, n in dims)), src=src)
        return
    _tracer.current().at().iota(_t(_flat2(dst), "dst"), float(offset), float(channel_multiplier), float(step))


@_tracer.status("partial: patterns linear in the flat free index")
def affine_select(dst, pattern, offset=0, channel_multiplier=0, on_true_tile=None, on_false_value=0.0,
                  cmp_op=nl.equal, name=None):
    """dst = on_true_tile where cmp_op(offset + c * channel_multiplier + sum(step_d * i_d), 0), else
    on_false_value (GpSimd; the causal mask of attention)."""
    step = _linear_step(pattern, dst, "affine_select")
    _tracer.current().at().affine_select(_t(_flat2(dst), "dst"), _t(_flat2(on_true_tile), "on_true_tile"),
                                         float(offset), float(channel_multiplier), float(step),
                                         _alu(cmp_op, "cmp_op"), float(on_false_value))


# ------------------------------------------------ selection, search, scan
def max8(dst, src, name=None, **hints):
    """dst [P, 8] = the 8 largest values of each partition of src, descending."""
    _emit("max8", _core.Engine.vector, [_flat2(dst), _flat2(src)])


def nc_find_index8(dst, data, vals, name=None, **hints):
    """dst [P, 8] (uint16/uint32) = the index of each of vals' 8 values' first
    occurrence in data's partition (all ones when absent)."""
    _emit("find_index8", _core.Engine.vector, [_flat2(dst), _flat2(data), _flat2(vals)])


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None, **hints):
    """dst = data with the first occurrence of each of vals' 8 values (in
    order) replaced by imm; dst_idx gets the indices."""
    ops = [_flat2(dst), _flat2(data), _flat2(vals)] + ([_flat2(dst_idx)] if dst_idx is not None else [])
    _emit("match_replace8", _core.Engine.vector, ops, imm0=float(imm), acc=dst_idx is not None)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None, **hints):
    """r[i] = op1(op0(data0[i], r[i - 1]), data1[i]) along each partition,
    r[-1] = initial (a scalar or a [P, 1] column), in FP32."""
    ops = [_flat2(dst), _flat2(data0), _flat2(data1)]
    col = _is_tile(initial)
    if col:
        ops.append(_as_col(initial))
    _emit("tensor_scan", _core.Engine.vector, ops, alu0=_alu(op0, "op0"), alu1=_alu(op1, "op1"),
          imm0=0.0 if col else float(initial), col0=col, rev0=bool(reverse0), rev1=bool(reverse1))


_CUMULATIVE_START = {"add": 0.0, "subtract": 0.0, "mult": 1.0, "max": float("-inf"), "min": float("inf")}


@_tracer.status("partial: reduce_cmd reset_reduce and load_reduce (continuing the accumulator of an earlier "
                "instruction, reduce_cmd=reduce, is not supported); issued as a tensor_scalar and a scan")
def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce,
                             reverse0=False, name=None, **hints):
    """reg = op1(op0(src[i], imm0), reg); dst[i] = reg along each partition
    (FP32), reg starting at op1's identity (reset_reduce) or imm1
    (load_reduce)."""
    rc = globals()["reduce_cmd"]
    alu1 = _ops.resolve(op1).alu if op1 is not None else None
    if alu1 not in _CUMULATIVE_START:
        raise ValueError(f"tensor_scalar_cumulative op1={op1!r}: add, subtract, multiply, max or min "
                         f"({_tracer.kernel_location()})")
    if int(reduce_cmd) == int(rc.load_reduce):
        start = float(imm1)
    elif int(reduce_cmd) == int(rc.reset_reduce):
        start = _CUMULATIVE_START[alu1]
    else:
        raise NotImplementedError(f"not supported: tensor_scalar_cumulative(reduce_cmd={reduce_cmd!r}): only "
                                  "reset_reduce and load_reduce")
    if any(_core.dtype_size(t.dtype) == 4 and t.dtype != "float32" for t in (dst, src)):
        raise ValueError(f"tensor_scalar_cumulative moves no 32-bit integers (the ISA's rule) "
                         f"({_tracer.kernel_location()})")
    y = _scratch(src.shape)
    tensor_scalar(dst=y, data=src, op0=op0, operand0=imm0, reverse0=reverse0)
    tensor_tensor_scan(dst=dst, data0=y, data1=y, initial=start, op0=op1, op1=None)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=None, reverse_pred=False, name=None, **hints):
    """dst = on_true where predicate (not predicate with reverse_pred), else
    on_false (a scalar or a [P, 1] column); reduce_res gets the row maxima."""
    if reduce_op is not None and _ops.resolve(reduce_op).alu != "max":
        raise NotImplementedError("not supported: select_reduce(reduce_op=...) other than nl.maximum")
    ops = [_flat2(dst), _flat2(predicate), _flat2(on_true)]
    col = _is_tile(on_false)
    if col:
        ops.append(_as_col(on_false))
    if reduce_res is not None:
        ops.append(_as_col(reduce_res))
    _emit("select_reduce", _core.Engine.vector, ops, imm0=0.0 if col else float(on_false), col0=col,
          acc=reduce_res is not None, rev0=bool(reverse_pred),
          imm2=float(_register_code(reduce_cmd, reduce_res)))


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0.0, on_false_value=nl.fp32.min, name=None):
    """dst[p, i] = on_true_tile[p, i] where comp_op0(range_start + i, bound0[p])
    and comp_op1(range_start + i, bound1[p]), else on_false_value; reduce_res
    gets the row maxima (NeuronCore-v3+)."""
    ops = [_flat2(dst), _flat2(on_true_tile), _as_col(bound0), _as_col(bound1)]
    if reduce_res is not None:
        ops.append(_as_col(reduce_res))
    _emit("range_select", _core.Engine.vector, ops, alu0=_alu(comp_op0, "comp_op0"),
          alu1=_alu(comp_op1, "comp_op1"), imm0=float(range_start), imm1=float(on_false_value),
          acc=reduce_res is not None, imm2=float(_register_code(reduce_cmd, reduce_res)))


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """For partitions 0, 16, ..., 112: the indices (+ index_offset) of src's
    non-zero elements, then padding_val, then their count (GpSimd, v3+)."""
    _emit("nonzero_count", _core.Engine.gpsimd, [_flat2(dst), _flat2(src)], imm0=float(index_offset),
          imm1=float(padding_val))


def nc_n_gather(dst, data, indices, name=None):
    """dst[p, j] = data[p, indices[p, j]] over each partition's flattened free dims (GpSimd)."""
    _emit("n_gather", _core.Engine.gpsimd, [_flat2(dst), _flat2(data), _flat2(indices)])


def nc_stream_shuffle(dst=None, src=None, shuffle_mask=None, name=None, **hints):
    """dst[q*32 + i] = src[q*32 + shuffle_mask[i]] in every 32-partition
    quadrant (255 keeps dst partition i)."""
    mask = [int(m) for m in shuffle_mask]
    _emit("stream_shuffle", _core.Engine.vector, [_flat2(dst), _flat2(src)], table=mask)


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Per 16-partition group: num_elem_per_idx elements at each of the
    group's indices (flattened partition-major) from every partition."""
    per_group = index.size // max(1, index.shape[0] // 16)
    valid = per_group if num_valid_indices is None else int(num_valid_indices)
    _emit("local_gather", _core.Engine.gpsimd, [_flat2(dst), _flat2(src_buffer), _flat2(index)],
          imm0=float(num_elem_per_idx), imm1=float(valid))


# Random numbers live in _isa_random.
from tern.nki._isa_random import (dropout, rand2, rand_get_state, rand_set_state, rng,  # noqa: E402,F401
                                  set_rng_seed)
# Cross-core synchronization and sequencer registers live in _isa_control.
from tern.nki._isa_control import (core_barrier, register_alloc, register_load,  # noqa: E402,F401
                                   register_move, register_store, scalar_load, scalar_store, sendrecv,
                                   NkiScalar, VirtualRegister)


def sequence_bounds(dst, segment_ids, name=None):
    """dst [1, 2, N]: for each of the N segment ids, the first index of its
    run of equal ids and one past its last (padding, id 0: N and -1), on the
    GpSimd engine."""
    _emit("sequence_bounds", _core.Engine.gpsimd, [_flat2(dst), _flat2(segment_ids)])


_ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", None), ("add", None),
                    ("subtract", None), (None, None)}


@_tracer.status("partial: issued as a Vector tensor_scalar (FP32) then a Scalar activation; reduce_op nl.add "
                "only; relu_param 0 only")
def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False,
              reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle, engine=None, name=None, **hints):
    """dst = op((data op0 imm0) op1 imm1) on NeuronCore-v4's Activation2
    (imm0 / imm1 scalars or [P, 1] columns; nl.bypass / None skips an op);
    reduce_res / reduce_cmd as nisa.activation."""
    if _tracer.current().chip.core_version < 4:
        raise ValueError(f"activate2 needs NeuronCore-v4 (trn3) ({_tracer.kernel_location()})")
    names = tuple(None if o is None or _ops.resolve(o).alu in (None, "bypass") else _ops.resolve(o).alu
                  for o in (op0, op1))
    names = tuple({"mult": "multiply"}.get(n, n) for n in names)
    if names not in _ACTIVATE2_PAIRS:
        raise ValueError(f"activate2(op0={op0!r}, op1={op1!r}): the pairs are (multiply, add / subtract / "
                         f"bypass), (add / subtract, bypass), (bypass, bypass) ({_tracer.kernel_location()})")
    if _is_tile(relu_param) or float(relu_param) != 0.0:
        raise NotImplementedError("not supported: activate2(relu_param=...) other than 0.0")
    tmp = _scratch(data.shape)
    tensor_scalar(dst=tmp, data=data, op0=op0 if names[0] else nl.add, operand0=imm0 if names[0] else 0.0,
                  reverse0=reverse0, op1=op1 if names[1] else None, operand1=imm1 if names[1] else None,
                  reverse1=reverse1)
    activation(dst=dst, op=op, data=tmp, reduce_op=reduce_op, reduce_res=reduce_res, reduce_cmd=reduce_cmd)



_HERE = (__name__, "tern.nki._isa_transpose", "tern.nki._isa_control", "tern.nki._isa_random")
for _name, _fn in list(globals().items()):
    if callable(_fn) and not _name.startswith("_") and getattr(_fn, "__module__", None) in _HERE \
            and not isinstance(_fn, type) and _name not in ("get_nc_version", "register_alloc", "scalar_load"):
        globals()[_name] = _noop_when_empty(_fn)
del enum
