"""Indirect DMA from .ap(vector_offset= / scalar_offset=, indirect_dim=k):
each partition's access starts at offset + index * stride(k) of the base
HBM tensor, the index read from SBUF at run time. tern issues it as the
simulator's dma_gather / dma_scatter over a [rows, F] view of the base
tensor whose rows step by stride(k)."""
import math

from tern.nki import _hoist
from tern.nki import _tensor as T
from tern.nki import _tracer


def _table(view):
    """The HBM [rows, F] view whose row r is the access at index r."""
    from tern import _core
    scalar, vector, k, strides = view._indirect
    shape, dtype = _tracer.current().hbm_shape(view.name)
    if shape is None:
        raise NotImplementedError("not supported: an indirect access into a tensor that is not a whole "
                                  "HBM tensor of the kernel")
    if not 0 <= k < len(strides):
        raise ValueError(f"indirect_dim={k} for an HBM view of {len(strides)} dims "
                         f"({_tracer.kernel_location()})")
    stride = strides[k]
    if stride <= 0:
        raise ValueError(f"indirect_dim={k}: that dim of the view does not move through memory "
                         f"(stride {stride}; {_tracer.kernel_location()})")
    # The base tensor's elements counted in the view's dtype.
    total = math.prod(shape) * _core.dtype_size(dtype) // _core.dtype_size(view.dtype)
    if scalar is not None and view._np > 1 and view._row_stride % stride:
        # Partitions that step by less than (or not a multiple of) one index
        # of indirect_dim: table rows at the step both are multiples of.
        stride = math.gcd(stride, view._row_stride)
    span = 1 + sum((c - 1) * abs(s) for s, c in view._free)
    rows = max(1, (total - view._off - span) // stride + 1)
    t = T.NkiTensor(view._base, view.buffer, view.dtype, 0, rows, view._off, view._free, view.name, stride)
    return t, scalar, vector, strides[k] // stride


def _index_tile(scalar, vector, parts, pstride_rows, per_index=1):
    """The [P, 1] int32 index tile: the vector offsets, or the scalar offset
    (times the table rows one index of indirect_dim spans) plus each
    partition's own row step."""
    from tern.nki import isa
    from tern.nki import language as nl
    if vector is not None:
        return vector if vector.ndim == 2 else vector._like(vector._p0, vector._np, vector._off, [(1, 1)])
    s = scalar._like(scalar._p0, 1, scalar._off, [(1, 1)])
    if per_index != 1:
        # Scaled on the Vector engine, which starts a one-partition access at
        # a quadrant: an offset elsewhere is first moved to partition 0.
        scaled = nl.ndarray((1, 1), dtype=s.dtype, buffer=nl.sbuf)
        if s._p0 % 32:
            isa.dma_copy(dst=scaled, src=s)
            s = scaled
        isa.tensor_scalar(dst=scaled, data=s, op0=nl.multiply, operand0=per_index)
        s = scaled
    if parts == 1:
        return s
    from tern.nki import _functions as F
    idx = nl.ndarray((parts, 1), dtype=s.dtype, buffer=nl.sbuf)
    isa.iota(dst=idx, pattern=[[0, 1]], offset=0, channel_multiplier=pstride_rows)
    return F.binary(nl.add, idx, F.broadcast_partitions(s, parts), dtype=s.dtype)


def dma(dst, src, accumulate, skip, engine):
    """dst <- src where one side is an indirect HBM view."""
    b = _tracer.current().at()
    if getattr(src, "_indirect", None):
        table, scalar, vector, per = _table(src)
        if dst.is_hbm:
            raise NotImplementedError("not supported: an indirect DMA from HBM into HBM; gather into SBUF")
        pstride = src._row_stride // table._row_stride if table._row_stride else 0
        idx = _index_tile(scalar, vector, dst.shape[0], pstride, per)
        _hoist.wrote(dst)
        b.dma_gather(dst._tensor(), table._tensor(), idx._tensor(), -1, skip, engine)
        return
    table, scalar, vector, per = _table(dst)
    if src.is_hbm:
        raise NotImplementedError("not supported: an indirect DMA from HBM into HBM; scatter from SBUF")
    pstride = dst._row_stride // table._row_stride if table._row_stride else 0
    idx = _index_tile(scalar, vector, src.shape[0], pstride, per)
    _hoist.wrote(table)
    b.dma_scatter(table._tensor(), src._tensor(), idx._tensor(), -1, accumulate, engine)
