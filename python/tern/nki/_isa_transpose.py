"""nki.isa.dma_transpose: 2-D, 3-D and 4-D transposes by the DMA engine,
direct or indirect (a gather-transpose by an index tile)."""
import itertools

from tern import _core
from tern.nki import _tracer
from tern.nki import isa_enums as constants
from tern.nki.isa_enums import dge_mode, oob_mode


def _isa():
    from tern.nki import isa
    return isa


def _indirect(x):
    return getattr(x, "_indirect", None)


def _scratch(shape, dtype):
    return _isa()._scratch(shape, dtype)


def _t(x, what):
    return _isa()._t(x, what)


def _flat2(x):
    return _isa()._flat2(x)


@_tracer.status("partial: a 3-D / 4-D transpose whose middle dims are not 1 is timed as one DMA transpose per "
                "middle index; the indirect form as a gather then a transpose")
def dma_transpose(dst, src, axes=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    """dst = src transposed by the DMA engine: [A, B] -> [B, A], [A, B, C] ->
    [C, B, A] (axes (2, 1, 0)), [A, B, C, D] -> [D, B, C, A] (axes (3, 1, 2,
    0)); the bytes move unchanged. dge_mode=hwdge (the hardware DGE) moves
    2-byte types only."""
    want = tuple(range(src.ndim))[::-1] if src.ndim < 4 else (3, 1, 2, 0)
    if src.ndim > 4 or (axes is not None and tuple(axes) != want):
        raise NotImplementedError(f"not supported: dma_transpose of a {src.ndim}-D tile with axes="
                                  f"{None if axes is None else tuple(axes)} (NKI's are (1, 0), (2, 1, 0), "
                                  f"(3, 1, 2, 0))")
    if _tracer.is_hwdge(dge_mode) and _core.dtype_size(src.dtype) != 2:
        raise ValueError(f"dma_transpose(dge_mode=hwdge) moves 2-byte types, not {src.dtype} "
                         f"({_tracer.kernel_location()})")
    if _tracer.is_hwdge(dge_mode) and _indirect(src):
        raise ValueError(f"dma_transpose(dge_mode=hwdge) of an indirect source: the indirect transpose "
                         f"takes software DGE (swdge) ({_tracer.kernel_location()})")
    if _indirect(src) and _indirect(src)[1] is not None and _indirect(src)[1].ndim == 2 \
            and _indirect(src)[1].shape[1] > 1:
        _transpose_index_columns(dst, src, axes, dge_mode, oob_mode)
        return
    if _indirect(src):
        # The indirect form (a software-DGE dma_gather_transpose): tern
        # gathers the indexed rows into SBUF, then transposes them.
        staged = _scratch(src.shape, src.dtype)
        from tern.nki import _indirect as ind
        ind.dma(staged, src, False, int(oob_mode) == int(constants.oob_mode.skip), _core.Engine.sync)
        src = staged
    if src.ndim <= 2:
        with _tracer.hardware_dge(_tracer.current().at(), dge_mode) as b:
            b.dma_transpose(_t(_flat2(dst), "dst"), _t(_flat2(src), "src"))
        return
    if dst.ndim != src.ndim or tuple(dst.shape) != tuple(src.shape[i] for i in want):
        raise ValueError(f"dma_transpose: dst {tuple(dst.shape)} is not src {tuple(src.shape)} permuted by "
                         f"{want} ({_tracer.kernel_location()})")
    # One [A, D] -> [D, A] transpose per index of the middle dims.
    with _tracer.hardware_dge(_tracer.current().at(), dge_mode) as b:
        for mid in itertools.product(*(range(n) for n in src.shape[1:-1])):
            b.dma_transpose(_t(_plane(dst, mid), "dst"), _t(_plane(src, mid), "src"))


def _transpose_index_columns(dst, src, axes, dge_mode, oob_mode):
    """An indirect transpose with a [P, n] index tile: source row c * P + i
    is index [i, c]; one gather-transpose of P rows per index column."""
    _, vector, k, strides = src._indirect
    parts, n = vector.shape
    rows = src.shape[0]
    if rows > parts * n:  # nki.isa.dma_transpose: indices.shape[0] * indices.shape[1] >= src.shape[0]
        raise ValueError(f"dma_transpose: {rows} indirect rows with a {list(vector.shape)} index tile "
                         f"({_tracer.kernel_location()})")
    for c in range(-(-rows // parts)):
        m = min(parts, rows - c * parts)
        part = src._like(src._p0, m, src._off, src._free, src._row_stride)
        part._indirect = (None, vector[0:m, c:c + 1], k, strides)
        cols = (slice(None),) * (dst.ndim - 1) + (slice(c * parts, c * parts + m),)
        dma_transpose(dst=dst[cols], src=part, axes=axes, dge_mode=dge_mode, oob_mode=oob_mode)


def _plane(x, mid):
    """The 2-D view x[:, mid..., :] of a tile or HBM tensor."""
    dims = x._dims()
    off = x._off + sum(i * dims[k + 1][0] for k, i in enumerate(mid))
    if x.is_hbm:
        return x._like(0, dims[0][1], off + x._p0 * x._row_stride, [dims[-1]], dims[0][0])
    return x._like(x._p0, x._np, off, [dims[-1]])
