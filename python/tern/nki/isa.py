"""nki.isa for tern: one simulated instruction per call, destination first,
with the public NKI parameter names. Calls tern does not implement raise
NotImplementedError naming the call (see docs/nki.md)."""
from tern import _core
from tern.nki import _tracer
from tern.nki import language as nl

# Engines (the `engine=` parameter).
tensor_engine = _core.Engine.tensor
vector_engine = _core.Engine.vector
scalar_engine = _core.Engine.scalar
gpsimd_engine = _core.Engine.gpsimd
sync_engine = _core.Engine.sync
unknown_engine = None


class matmul_perf_mode:
    none = None
    double_row = "double_row"


def _t(x, what):
    if not isinstance(x, nl.NkiTensor):
        raise TypeError(f"{what} must be an nki tensor, got {type(x).__name__}")
    return x._tensor()


def _alu(op, what="op"):
    if op is None:
        return _core.alu_op("bypass")
    if not isinstance(op, nl._Op) or op.alu is None:
        raise ValueError(f"{what}={op!r} is not an ALU operator (nl.add, nl.multiply, ...)")
    return _core.alu_op(op.alu)


def _auto_accumulate(dst, view, accumulate):
    """accumulate=None: overwrite on the first matmul into this region of the
    PSUM tile, accumulate on the later ones (tracked per allocation, so a
    fresh tile at a reused address starts over)."""
    written = dst._alloc.matmul_written if dst._alloc is not None else _tracer.current().matmul_targets
    key = repr(view)
    if accumulate is None:
        accumulate = key in written
    written.add(key)
    return accumulate


def _engine(engine, default):
    return default if engine is None else engine


def _broadcast_column(col, like):
    """A [P, 1] tensor seen as [P, free...] through stride-0 free dims."""
    if col.shape[0] != like.shape[0] or col.shape[1:] not in ((), (1,)):
        raise ValueError(f"a tensor operand must be a [{like.shape[0]}, 1] column, got {col.shape}")
    free = [(0, c) for c in like.shape[1:]]
    return nl.NkiTensor(col._base, col.buffer, col.dtype, col._p0, col._np, col._off, free, col.name,
                        col._row_stride, col._alloc)


# ------------------------------------------------------------ data movement
def dma_copy(dst, src, dst_rmw_op=None, engine=None, name=None, **unsupported):
    """dst <- src (cast through FP32); dst_rmw_op=nl.add accumulates into dst."""
    _reject("dma_copy", unsupported)
    if dst_rmw_op not in (None, nl.add):
        raise NotImplementedError(f"not supported: dma_copy(dst_rmw_op={dst_rmw_op!r}): only nl.add")
    b = _tracer.current().at()
    b.dma_copy(_t(dst, "dst"), _t(src, "src"), -1, dst_rmw_op is nl.add, _engine(engine, sync_engine))


def dma_compute(dst, srcs, reduce_op, scales=None, name=None, **unsupported):
    """dst = srcs[0] + srcs[1] + ... in the DMA engines (FP32 inside); like
    the hardware, only reduce_op=nl.add and scales of 1.0."""
    _reject("dma_compute", unsupported)
    if reduce_op is not nl.add:
        raise NotImplementedError(f"not supported: dma_compute(reduce_op={reduce_op!r}): only nl.add")
    if scales is not None and any(float(x) != 1.0 for x in scales):
        raise NotImplementedError("not supported: dma_compute with scales other than 1.0")
    srcs = list(srcs)
    if not srcs:
        raise ValueError("dma_compute needs at least one source")
    b = _tracer.current().at()
    d = _t(dst, "dst")
    rest = [x for x in srcs if x is not dst]
    if len(rest) == len(srcs):  # dst is not a source: start from the first
        b.dma_copy(d, _t(rest.pop(0), "srcs[0]"), -1, False, sync_engine)
    for x in rest:
        b.dma_copy(d, _t(x, "srcs"), -1, True, sync_engine)


def dma_transpose(dst, src, name=None):
    _tracer.current().at().dma_transpose(_t(dst, "dst"), _t(src, "src"))


# ----------------------------------------------------------------- tensor
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=None, name=None):
    """dst[M, N] (+)= stationary[K, M].T @ moving[K, N] on the Tensor engine.
    accumulate=None accumulates when this PSUM region was written by an
    earlier matmul of the kernel (the first one overwrites)."""
    if is_transpose or tile_position or tile_size:
        raise NotImplementedError("not supported: nc_matmul with is_transpose / tile_position / tile_size")
    tr = _tracer.current()
    d = _t(dst, "dst")
    accumulate = _auto_accumulate(dst, d, accumulate)
    tr.at().matmul(d, _t(stationary, "stationary"), _t(moving, "moving"), bool(accumulate),
                   perf_mode == matmul_perf_mode.double_row)


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """MX matmul (trn3): x4-packed data with E8M0 scales [P/8, F]."""
    if tile_position or tile_size:
        raise NotImplementedError("not supported: nc_matmul_mx with tile_position / tile_size")
    tr = _tracer.current()
    d = _t(dst, "dst")
    accumulate = _auto_accumulate(dst, d, accumulate)
    tr.at().matmul_mx(d, _t(stationary, "stationary"), _t(stationary_scale, "stationary_scale"),
                      _t(moving, "moving"), _t(moving_scale, "moving_scale"), bool(accumulate))


def nc_transpose(dst, data, engine=None, name=None):
    """Tensor engine (<= 128 x 128, into PSUM) or Vector engine (<= 32 x 32)."""
    default = tensor_engine if dst.buffer is nl.psum else vector_engine
    _tracer.current().at().transpose(_t(dst, "dst"), _t(data, "data"), _engine(engine, default))


# ------------------------------------------------------- vector / scalar
def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    _tracer.current().at().tensor_tensor(_t(dst, "dst"), _t(data1, "data1"), _t(data2, "data2"), _alu(op),
                                         _engine(engine, vector_engine))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None):
    """(data op0 operand0) op1 operand1; operands are scalars or [P, 1] columns."""
    if reverse0 or reverse1:
        raise NotImplementedError("not supported: tensor_scalar with reverse0 / reverse1")
    eng = _engine(engine, vector_engine)
    b = _tracer.current().at()
    tensors = isinstance(operand0, nl.NkiTensor) or isinstance(operand1, nl.NkiTensor)
    if not tensors:
        b.tensor_scalar(_t(dst, "dst"), _t(data, "data"), _alu(op0, "op0"), float(operand0), _alu(op1, "op1"),
                        0.0 if operand1 is None else float(operand1), eng)
        return
    # Column operands: one tensor_tensor per stage against the broadcast column.
    if eng is scalar_engine:
        eng = vector_engine
    for i, (op, operand) in enumerate(((op0, operand0), (op1, operand1))):
        if op is None:
            break
        src = data if i == 0 else dst
        if isinstance(operand, nl.NkiTensor):
            b.tensor_tensor(_t(dst, "dst"), _t(src, "data"), _broadcast_column(operand, dst)._tensor(),
                            _alu(op), eng)
        else:
            b.tensor_scalar(_t(dst, "dst"), _t(src, "data"), _alu(op), float(operand), _alu(None), 0.0, eng)


def tensor_copy(dst, src, engine=None, name=None):
    _tracer.current().at().tensor_copy(_t(dst, "dst"), _t(src, "src"), _engine(engine, vector_engine))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduces the free dims of data (tern reduces all free dims: axis must name them all)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if sorted(a % data.ndim for a in axes) != list(range(1, data.ndim)):
        raise NotImplementedError(f"not supported: tensor_reduce over axis={axis} of a {data.ndim}-d tile: tern reduces "
                                  "all free dims")
    _tracer.current().at().tensor_reduce(_t(dst, "dst"), _t(data, "data"), _alu(op), bool(negate))


def memset(dst, value, engine=None, name=None):
    _tracer.current().at().memset(_t(dst, "dst"), float(value), _engine(engine, vector_engine))


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, name=None):
    """dst = op(data * scale + bias) on the Scalar engine; reduce_res gets the row sums."""
    if not isinstance(op, nl._Op) or op.act is None:
        raise ValueError(f"op={op!r} is not an activation function (nl.exp, nl.gelu, ...)")
    if isinstance(scale, nl.NkiTensor):
        raise NotImplementedError("not supported: activation with a tensor scale")
    if bias is not None and not isinstance(bias, nl.NkiTensor):
        value = float(bias)  # a scalar bias: a constant [P, 1] column
        bias = nl.ndarray((data.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        memset(dst=bias, value=value)
    if reduce_res is not None and reduce_op not in (None, nl.add):
        raise NotImplementedError(f"not supported: activation(reduce_op={reduce_op!r}): only nl.add")
    _tracer.current().at().activation(_t(dst, "dst"), _core.act_func(op.act), _t(data, "data"),
                                      None if bias is None else _t(bias, "bias"), float(scale),
                                      None if reduce_res is None else _t(reduce_res, "reduce_res"))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """activation with its row reduction (reduce_op nl.add) in one Scalar instruction."""
    activation(dst=dst, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, engine=None,
                         name=None):
    """(data op0 operand0) op1 operand1 with a scalar/column operand0 and a
    tensor operand1; tern issues it as two Vector instructions (timing: two)."""
    if reverse0 or reverse1:
        raise NotImplementedError("not supported: scalar_tensor_tensor with reverse0 / reverse1")
    tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0, engine=engine)
    tensor_tensor(dst=dst, data1=dst, data2=operand1, op=op1, engine=engine)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=False, name=None, **unsupported):
    """tensor_scalar with one operator, then a reduction of the result over the
    free dims into reduce_res; tern issues two Vector instructions."""
    _reject("tensor_scalar_reduce", unsupported)
    if reverse0:
        raise NotImplementedError("not supported: tensor_scalar_reduce with reverse0")
    tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0)
    _tracer.current().at().tensor_reduce(_t(reduce_res, "reduce_res"), _t(dst, "dst"), _alu(reduce_op), False)


def reciprocal(dst, data, name=None):
    _tracer.current().at().reciprocal(_t(dst, "dst"), _t(data, "data"))


def exponential(dst, src, max_value=None, reduce_res=None, name=None):
    """dst = exp(src - max_value) (trn3 Vector engine), optional row sums."""
    _tracer.current().at().exponential(_t(dst, "dst"), _t(src, "src"),
                                       None if max_value is None else _t(max_value, "max_value"),
                                       None if reduce_res is None else _t(reduce_res, "reduce_res"))


def bn_stats(dst, data, name=None):
    _tracer.current().at().bn_stats(_t(dst, "dst"), _t(data, "data"))


def bn_aggr(dst, data, name=None):
    _tracer.current().at().bn_aggr(_t(dst, "dst"), _t(data, "data"))


def tensor_copy_predicated(dst, src, predicate, name=None):
    _tracer.current().at().copy_predicated(_t(dst, "dst"), _t(predicate, "predicate"), _t(src, "src"))


def quantize_mx(dst, src, dst_scale, name=None):
    """BF16/FP16 src [P, F] -> x4 FP8 dst [P, F/4] and E8M0 dst_scale [P/8, F/4] (trn3 scales)."""
    _tracer.current().at().quantize_mx(_t(dst, "dst"), _t(dst_scale, "dst_scale"), _t(src, "src"))


def tensor_partition_reduce(dst, op, data, name=None):
    _tracer.current().at().partition_reduce(_t(dst, "dst"), _t(data, "data"), _alu(op))


def _linear_step(pattern, dst, call):
    """The per-element step of an affine pattern [[step, num], ...] that is
    linear in the flat free index (each step = the inner step x inner count)."""
    dims = [(int(s), int(n)) for s, n in pattern]
    total = 1
    for _, n in dims:
        total *= n
    free = 1
    for c in dst.shape[1:]:
        free *= c
    if total != free:
        raise ValueError(f"{call}: the pattern covers {total} elements per partition, dst has {free}")
    step = dims[-1][0] if dims else 1
    for (s_out, _), (s_in, n_in) in zip(dims, dims[1:]):
        if s_out != s_in * n_in:
            raise NotImplementedError(f"not supported: {call} with a pattern that is not linear in the flat index: {pattern}")
    return step


def iota(dst, pattern, offset, channel_multiplier=0, name=None):
    """dst[c, i...] = offset + c * channel_multiplier + sum(step_d * i_d) on GpSimd."""
    step = _linear_step(pattern, dst, "iota")
    _tracer.current().at().iota(_t(dst, "dst"), float(offset), float(channel_multiplier), float(step))


def affine_select(dst, pattern, offset, channel_multiplier, on_true_tile, on_false_value, cmp_op=nl.equal,
                  name=None):
    """dst = on_true_tile where cmp_op(offset + c * channel_multiplier + sum(step_d * i_d), 0), else
    on_false_value (GpSimd; the causal mask of attention)."""
    step = _linear_step(pattern, dst, "affine_select")
    _tracer.current().at().affine_select(_t(dst, "dst"), _t(on_true_tile, "on_true_tile"), float(offset),
                                         float(channel_multiplier), float(step), _alu(cmp_op, "cmp_op"),
                                         float(on_false_value))


def _reject(call, unsupported):
    if unsupported:
        raise NotImplementedError(f"not supported: nisa.{call}({', '.join(sorted(unsupported))}=...)")


for _name in ("tensor_tensor_scan", "range_select", "select_reduce", "max8", "nc_find_index8",
              "nc_stream_shuffle", "local_gather", "rng", "activate2", "sendrecv", "core_barrier",
              "register_alloc", "register_load", "register_store", "register_move"):
    globals()[_name] = _tracer.not_yet(f"nisa.{_name}")
