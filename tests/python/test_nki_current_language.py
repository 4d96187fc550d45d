"""Current NKI API: nki.language tensors, launch grids, access patterns
(.ap, indirect offsets), the view methods and constants."""
import dataclasses
import math
import numpy as np
import pytest
import torch
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


# ================================================================ nki.language: tensors
def k_ndarray_forms(x):
    a = nl.ndarray([P, 16], nl.float32, buffer=nl.sbuf, name="a_list_shape")  # list shape, dtype positional
    b = nl.ndarray((P, 16), dtype=nl.float32, name=None)  # buffer omitted: SBUF
    c = nl.ndarray(shape=(P, 16), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4096))
    ps = nl.ndarray((P, 16), nl.float32, buffer=nl.psum, address=(0, 2 * 2048))
    nisa.dma_copy(dst=a, src=x)
    nisa.tensor_scalar(dst=b, data=a, op0=nl.add, operand0=1.0)
    nisa.tensor_copy(dst=ps, src=b)
    nisa.tensor_tensor(dst=c, data1=ps, data2=a, op=nl.add)
    out = nl.ndarray(list(x.shape), nl.float32, buffer=nl.shared_hbm, name="result")
    nisa.dma_copy(dst=out, src=c)
    scratch = nl.ndarray((P, 16), nl.float32, buffer=nl.private_hbm)
    nisa.dma_copy(dst=scratch, src=c)
    out2 = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out2, src=scratch)
    assert a.shape == (P, 16) and isinstance(a.shape, tuple) and a.dtype == nl.float32
    assert a.buffer == nl.sbuf and ps.buffer == nl.psum and out.buffer == nl.shared_hbm
    assert b.buffer in (nl.sbuf,) and scratch.buffer != nl.shared_hbm
    return out, out2


@pytest.mark.parametrize("target", V2)
def test_ndarray_argument_forms(target):
    x = normal((P, 16), 180)
    out, out2 = run(k_ndarray_forms, target, x)
    assert np.array_equal(out, (x + np.float32(1)) + x) and np.array_equal(out2, out)


def k_tile_size(x):
    ts = nl.tile_size
    vals = [ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax, ts.bn_stats_fmax,
            ts.total_available_sbuf_size]
    assert all(isinstance(v, int) for v in vals)
    t = nl.ndarray((ts.pmax, ts.psum_fmax), nl.float32, buffer=nl.psum)  # usable as shapes
    nisa.memset(dst=t, value=1.0)
    out = nl.ndarray((1, len(vals)), nl.int32, buffer=nl.shared_hbm)
    s = nl.ndarray((1, len(vals)), nl.int32, buffer=nl.sbuf)
    for i, v in enumerate(vals):
        nisa.memset(dst=s[:, i:i + 1], value=v)
    nisa.dma_copy(dst=out, src=s)
    return out


@pytest.mark.parametrize("target", V2)
def test_tile_size_fields(target):
    got = run(k_tile_size, target, np.zeros((1, 1), np.float32))[0]
    assert list(got[:5]) == [128, 512, 128, 512, 512]
    assert 64 * 1024 <= got[5] <= 256 * 1024  # usable SBUF bytes per partition
    assert nl.tile_size.gemm_stationary_fmax == nl.tile_size.pmax  # nki-library's assertions
    assert nl.tile_size.psum_fmax == nl.tile_size.gemm_moving_fmax


def k_ranges(x):
    t = load(x)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    tiles = []
    for i in nl.affine_range(4):
        tiles.append(t[:, i * 8:(i + 1) * 8])  # python lists built inside affine_range
    for i in nl.affine_range(0, 4, 2):
        nisa.tensor_scalar(dst=out[:, i * 8:(i + 1) * 8], data=tiles[i], op0=nl.multiply, operand0=10.0)
    for i in nl.sequential_range(1, 4, 2):
        nisa.tensor_scalar(dst=out[:, i * 8:(i + 1) * 8], data=tiles[i], op0=nl.multiply, operand0=20.0)
    acc = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for i in nl.static_range(4):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=tiles[i], op=nl.add)
    for i in nl.dynamic_range(2):
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)
    for i in nl.range(1, 3):
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=float(i))
    for i in range(2):  # plain Python range
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.subtract, operand0=0.5)
    return store(out), store(acc)


@pytest.mark.parametrize("target", V2)
def test_loop_iterators(target):
    x = ints_as_f32((P, 32), -9, 9, 181)
    out, acc = run(k_ranges, target, x)
    q = np.split(x, 4, axis=1)
    assert np.array_equal(out, np.concatenate([q[0] * 10, q[1] * 20, q[2] * 10, q[3] * 20], axis=1))
    assert np.array_equal(acc, (q[0] + q[1] + q[2] + q[3] + 2) * 1 * 2 - 1)


def k_ds_and_ellipsis(x):
    t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[...], src=x[...])
    nisa.memset(dst=t[:, nl.ds(8, 0)], value=99.0)  # size 0: a no-op
    nisa.dma_copy(dst=t[nl.ds(0, 0), :], src=x[0:0, :])  # empty: a no-op
    nisa.tensor_scalar(dst=t[..., 0:4], data=t[..., 0:4], op0=nl.add, operand0=100.0)
    nisa.tensor_scalar(dst=t[nl.ds(64, 64), nl.ds(4, 4)], data=t[64:128, 4:8], op0=nl.multiply, operand0=-1.0)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[...], src=t)
    row = nl.ndarray((1, x.shape[1]), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=row[0, ...], src=x[5, ...])  # an int index drops the dim, Ellipsis keeps the rest
    return out, row


@pytest.mark.parametrize("target", V2)
def test_ds_zero_size_and_ellipsis(target):
    x = normal((P, 16), 182)
    out, row = run(k_ds_and_ellipsis, target, x)
    want = x.copy()
    want[:, 0:4] += 100
    want[64:, 4:8] *= -1
    assert np.array_equal(out, want) and np.array_equal(row[0], x[5])


def k_hbm_reshape(x):
    """A (128, 64) HBM input seen as (256, 32): dim 0 changes, rows re-chunked."""
    v = x.reshape((256, 32))
    out = nl.ndarray((P, 64), nl.float32, buffer=nl.shared_hbm)
    for h in nl.affine_range(2):
        t = nl.ndarray((P, 32), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v[h * P:(h + 1) * P, :])
        nisa.dma_copy(dst=out[:, h * 32:(h + 1) * 32], src=t)
    flat = x.reshape((P * 64,))
    one = nl.ndarray((1, 64), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=one, src=flat[nl.ds(64 * 3, 64)].reshape([1, 64]))
    return out, one


@pytest.mark.parametrize("target", V2)
def test_hbm_reshape_changes_dim0(target):
    x = normal((P, 64), 183)
    out, one = run(k_hbm_reshape, target, x)
    v = x.reshape(256, 32)
    assert np.array_equal(out, np.concatenate([v[:128], v[128:]], axis=1))
    assert np.array_equal(one[0], x[3])


# ================================================================ launch grids
def k_spmd_info(x):
    """Each program writes [pid0, pid1, num_programs(0), num_programs(1), num_programs(), ndim] to its row."""
    out = nl.ndarray((4, 6), nl.int32, buffer=nl.shared_hbm)
    ndim = nl.program_ndim()
    p0 = nl.program_id(0) if ndim >= 1 else 0
    p1 = nl.program_id(axis=1) if ndim >= 2 else 0
    n0 = nl.num_programs(axes=0)
    n1 = nl.num_programs(1) if ndim >= 2 else 1
    row = p0 * n1 + p1
    vals = [p0, p1, n0, n1, nl.num_programs(), ndim]
    t = nl.ndarray((1, 6), nl.int32, buffer=nl.sbuf)
    for i, v in enumerate(vals):
        nisa.memset(dst=t[:, i:i + 1], value=v)
    nisa.dma_copy(dst=out[row:row + 1, :], src=t)
    return out


@pytest.mark.parametrize("target", V3)
def test_program_id_num_programs_ndim(target):
    z = np.zeros((1, 1), np.float32)
    k = nki.jit(k_spmd_info, platform_target=target)
    none = k(z)
    assert list(none[0]) == [0, 0, 1, 1, 1, 0]  # no grid: ndim 0, one program
    two = k[2](z)
    assert [list(r) for r in two[:2]] == [[0, 0, 2, 1, 2, 1], [1, 0, 2, 1, 2, 1]]
    grid = k[2, 2](z)
    assert [list(r) for r in grid] == [[p0, p1, 2, 2, 4, 2] for p0 in range(2) for p1 in range(2)]
    assert np.array_equal(nki.simulate(k_spmd_info, platform_target=target)[2, 2](z), grid)


def k_lnc_shard(x):
    """nki-library's LNC sharding: each program scales its half of the rows."""
    R, F = x.shape
    out = nl.ndarray((R, F), nl.float32, buffer=nl.shared_hbm)
    n = nl.num_programs(axes=0) if nl.program_ndim() != 0 else 1
    pid = nl.program_id(axis=0) if nl.program_ndim() != 0 else 0
    rows = R // n
    t = nl.ndarray((rows, F), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[nl.ds(pid * rows, rows), :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=float(pid + 1))
    nisa.dma_copy(dst=out[nl.ds(pid * rows, rows), :], src=t)
    return out


@pytest.mark.parametrize("target", V3)
def test_lnc2_row_sharding(target):
    x = normal((256, 32), 190)
    got = nki.jit(k_lnc_shard, platform_target=target)[2](x)
    assert np.array_equal(got[:128], x[:128]) and np.array_equal(got[128:], x[128:] * 2)
    assert np.array_equal(nki.jit(k_lnc_shard, platform_target=target)(x[:128]), x[:128])


# ================================================================ access patterns
def k_ap_strided(x):
    R, F = x.shape
    odd = nl.ndarray((R, F // 2), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=odd, src=x.ap([[F, R], [2, F // 2]], offset=1))  # odd columns
    bc = nl.ndarray((R, F), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=bc, src=x.ap(pattern=[[0, R], [1, F]], offset=3 * F))  # row 3 on every partition
    t = load(x)
    rep = nl.ndarray((R, 4, 8), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=rep, src=t.ap([[F, R], [0, 4], [1, 8]]))  # stride-0 free dim: repeat 4 times
    sub = nl.ndarray((R, 8), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sub, src=t.ap([[F, R], [1, 8]], offset=5))
    return store(odd), store(bc), store(rep), store(sub)


@pytest.mark.parametrize("target", V2)
def test_ap_strides_offsets_and_broadcasts(target):
    x = normal((P, 32), 191)
    odd, bc, rep, sub = run(k_ap_strided, target, x)
    assert np.array_equal(odd, x[:, 1::2])
    assert np.array_equal(bc, np.broadcast_to(x[3], x.shape))
    assert np.array_equal(rep, np.broadcast_to(x[:, None, :8], (P, 4, 8)))
    assert np.array_equal(sub, x[:, 5:13])


def k_ap_dtype(x):
    t = load(x)
    bits = nl.ndarray(x.shape, nl.uint32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bits, src=t.ap([[x.shape[1], P], [1, x.shape[1]]], dtype=nl.uint32))  # reinterpret
    nisa.tensor_scalar(dst=bits, data=bits, op0=nl.left_shift, operand0=1)  # clear the sign bit
    nisa.tensor_scalar(dst=bits, data=bits, op0=nl.right_shift, operand0=1)
    back = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=back, src=bits.ap([[x.shape[1], P], [1, x.shape[1]]], dtype=nl.float32))
    bytes_ = nl.ndarray((P, 4 * x.shape[1]), nl.uint8, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bytes_, src=t.ap(pattern=[[4 * x.shape[1], P], [1, 4 * x.shape[1]]], dtype=nl.uint8))
    return store(back), store(bytes_)


@pytest.mark.parametrize("target", V2)
def test_ap_dtype_reinterprets_bytes(target):
    x = normal((P, 16), 192)
    back, b = run(k_ap_dtype, target, x)
    assert np.array_equal(back, np.abs(x))
    assert np.array_equal(b, x.view(np.uint8).reshape(P, -1))


def k_gather_rows(table, idx):
    """Per-partition row gather: vector_offset = a [P, 1] int32 index column, indirect_dim=0."""
    V, D = table.shape
    i = load(idx)
    g = nl.ndarray((P, D), table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=table.ap([[D, P], [1, D]], offset=0, vector_offset=i, indirect_dim=0))
    half = nl.ndarray((P, D // 2), table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=half, src=table.ap([[D, P], [1, D // 2]], offset=D // 2, vector_offset=i[:, 0:1],
                                         indirect_dim=0), dge_mode=nisa.dge_mode.swdge)
    return store(g), store(half)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint32])
def test_ap_vector_offset_gather(target, idx_dtype):
    table = normal((300, 64), 193)
    idx = rng(194).integers(0, 300, size=(P, 1)).astype(idx_dtype)
    g, half = run(k_gather_rows, target, table, idx)
    assert np.array_equal(g, table[idx[:, 0]])
    assert np.array_equal(half, table[idx[:, 0], 32:])


def k_scatter_rows(src, idx, base):
    V, D = base.shape
    out = nl.ndarray((V, D), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=base)
    t, i = load(src), load(idx)
    nisa.dma_copy(dst=out.ap([[D, P], [1, D]], offset=0, vector_offset=i, indirect_dim=0), src=t)
    return out


@pytest.mark.parametrize("target", V3)
def test_ap_vector_offset_scatter(target):
    src, base = normal((P, 32), 195), normal((200, 32), 196)
    idx = rng(197).permutation(200)[:P].astype(np.int32).reshape(P, 1)
    got = run(k_scatter_rows, target, src, idx, base)
    want = base.copy()
    want[idx[:, 0]] = src
    assert np.array_equal(got, want)


def k_scatter_add(src, idx, base):
    V, D = base.shape
    out = nl.ndarray((V, D), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=base)
    t, i = load(src), load(idx)
    nisa.dma_copy(dst=out.ap([[D, P], [1, D]], offset=0, vector_offset=i, indirect_dim=0), src=t,
                  dst_rmw_op=nl.add, oob_mode=nisa.oob_mode.error)
    return out


@pytest.mark.parametrize("target", V3)
def test_ap_vector_offset_scatter_add(target):
    src, base = ints_as_f32((P, 16), -9, 9, 198), ints_as_f32((150, 16), -9, 9, 199)
    idx = rng(200).permutation(150)[:P].astype(np.int32).reshape(P, 1)
    got = run(k_scatter_add, target, src, idx, base)
    want = base.copy()
    np.add.at(want, idx[:, 0], src)
    assert np.array_equal(got, want)


def k_gather_oob_skip(table, idx):
    V, D = table.shape
    i = load(idx)
    g = nl.ndarray((P, D), table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=g, value=-1.0)
    nisa.dma_copy(dst=g, src=table.ap([[D, P], [1, D]], offset=0, vector_offset=i, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    return store(g)


@pytest.mark.parametrize("target", V3)
def test_ap_gather_oob_skip_leaves_rows(target):
    table = normal((64, 16), 201)
    idx = rng(202).integers(0, 64, size=(P, 1)).astype(np.int32)
    idx[::5] = 1000  # out of range: skipped
    got = run(k_gather_oob_skip, target, table, idx)
    bad = idx[:, 0] >= 64
    assert np.all(got[bad] == -1.0) and np.array_equal(got[~bad], table[idx[~bad, 0]])


def k_scalar_offset(k_cache, pos):
    """k_cache (B, S, d): rows pos .. pos+n of batch 1, the start read at run time (indirect_dim=1)."""
    B, S, d = k_cache.shape
    n = 16
    o = load(pos)
    t = nl.ndarray((n, d), k_cache.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=k_cache.ap([[d, n], [1, d]], offset=1 * S * d, scalar_offset=o, indirect_dim=1))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_ap_scalar_offset_dynamic_slice(target):
    kc = normal((2, 64, 32), 203)
    got = run(k_scalar_offset, target, kc, np.array([[21]], np.int32))
    assert np.array_equal(got, kc[1, 21:37])


def k_offsets_on_reshaped_views(flat, rows, pos):
    """indirect_dim counts the dims of the reshaped view the .ap is taken on:
    a gather of whole rows from a 1-D tensor seen as (R, C), and a scatter of
    single elements into a 2-D tensor seen flat (router_topk's one-hot scatter)."""
    R, C = 16, flat.shape[0] // 16
    o, i = load(pos), load(rows)
    t = nl.ndarray((1, C), flat.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=flat.reshape((R, C)).ap([[C, 1], [1, C]], offset=0, scalar_offset=o,
                                                      indirect_dim=0))
    out = nl.ndarray((R, C), nl.float32, buffer=nl.shared_hbm)
    z = nl.ndarray((R, C), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    nisa.dma_copy(dst=out, src=z)
    ones = nl.ndarray((R, 1), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    nisa.dma_copy(dst=out.reshape((R * C,)).ap([[1, R], [1, 1]], offset=0, vector_offset=i, indirect_dim=0),
                  src=ones)
    return store(t), out


@pytest.mark.parametrize("target", V3)
def test_ap_offsets_count_the_dims_of_a_reshaped_view(target):
    flat = normal((16 * 24,), 205)
    cols = rng(206).integers(0, 24, size=16)
    rows = (np.arange(16) * 24 + cols).astype(np.uint32).reshape(16, 1)  # one element per row, flat index
    row, onehot = run(k_offsets_on_reshaped_views, target, flat, rows, np.array([[5]], np.int32))
    assert np.array_equal(row[0], flat[5 * 24:6 * 24])
    want = np.zeros((16, 24), np.float32)
    want[np.arange(16), cols] = 1.0
    assert np.array_equal(onehot, want)


def k_scalar_offset_rows_of_an_expert(w, choice):
    """selective-expert MoE: w [E, R, C], the expert read at run time (indirect_dim=0), its R rows on R
    partitions (the partition step C is smaller than one expert), the offset at element 3 of a tile."""
    E, R, C = w.shape
    c = load(choice)
    t = nl.ndarray((R, C), w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=w.ap([[C, R], [1, C]], offset=0, scalar_offset=c.ap([[4, 1], [1, 1]], offset=3),
                                  indirect_dim=0))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_ap_scalar_offset_with_a_partition_step_inside_one_index(target):
    w = normal((5, 32, 16), 207)
    for e in (0, 3, 4):
        choice = np.array([[9, 9, 9, e]], np.int32)
        assert np.array_equal(run(k_scalar_offset_rows_of_an_expert, target, w, choice), w[e])


def k_scalar_offset_store(src, pos):
    """A dynamic-offset store (find_nonzero_indices style): dst=.ap(..., scalar_offset=, indirect_dim=1)."""
    R, C = 4, 64
    out = nl.ndarray((R, C), nl.float32, buffer=nl.shared_hbm)
    z = nl.ndarray((R, C), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    nisa.dma_copy(dst=out, src=z)
    t, o = load(src), load(pos)
    nisa.dma_copy(dst=out.ap([[C, 1], [1, 8]], offset=2 * C, scalar_offset=o, indirect_dim=1), src=t)
    return out


@pytest.mark.parametrize("target", V3)
def test_ap_scalar_offset_scatter(target):
    src = normal((1, 8), 204)
    got = run(k_scalar_offset_store, target, src, np.array([[13]], np.uint32))
    want = np.zeros((4, 64), np.float32)
    want[2, 13:21] = src[0]
    assert np.array_equal(got, want)


# ================================================================ view methods (NKI 0.3+)
def k_views_hbm(x):
    """x: (4, 8, 16) in HBM."""
    A, B, C = x.shape
    outs = []
    v1 = x.slice(dim=1, start=2, end=6)  # (4, 4, 16)
    v2 = x.permute(dims=[1, 0, 2])  # (8, 4, 16)
    v3 = x.select(dim=1, index=2)  # (4, 16)
    v4 = x.reshape_dim(2, (4, 4))  # (4, 8, 4, 4)
    v5 = x.flatten_dims(start_dim=1, end_dim=2)  # (4, 128)
    v6 = x.slice(0, 1, 2).select(dim=1, index=0)  # (1, 16)
    v7 = x.slice(dim=0, start=0, end=1).broadcast(dim=0, size=3)  # (3, 8, 16): HBM dim-0 broadcast
    v8 = x.select(dim=1, index=5).expand_dim(dim=1)  # (4, 1, 16)
    for v in (v1, v2, v3, v4, v5):
        t = nl.ndarray(v.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        outs.append(store(t))
    t6 = nl.ndarray((1, C), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t6, src=v6)
    outs.append(store(t6))
    for v in (v7, v8):
        t = nl.ndarray(v.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        outs.append(store(t))
    return tuple(outs)


@pytest.mark.parametrize("target", V3)
def test_view_methods_on_hbm(target):
    x = normal((4, 8, 16), 210)
    v1, v2, v3, v4, v5, v6, v7, v8 = run(k_views_hbm, target, x)
    assert np.array_equal(v1, x[:, 2:6])
    assert np.array_equal(v2, x.transpose(1, 0, 2))
    assert np.array_equal(v3, x[:, 2])
    assert np.array_equal(v4, x.reshape(4, 8, 4, 4))
    assert np.array_equal(v5, x.reshape(4, 128))
    assert np.array_equal(v6[0], x[1, 0])
    assert np.array_equal(v7, np.broadcast_to(x[0], (3, 8, 16)))
    assert np.array_equal(v8, x[:, 5:6, :])


def k_int_index_hbm_dim0(x):
    shapes = [x[2].shape, x.select(dim=0, index=2).shape, x[1, 3].shape, x[1, :, 0:4].shape]
    assert shapes == [(8, 16), (8, 16), (16,), (8, 4)], shapes
    t = nl.ndarray((8, 16), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[2])
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_int_index_drops_hbm_dim0(target):
    x = normal((4, 8, 16), 208)
    assert np.array_equal(run(k_int_index_hbm_dim0, target, x), x[2])


def k_squeeze_hbm_dim0(x):
    v = x[0:1, :].squeeze_dim(dim=0)  # (F,): an HBM view has no partition dim to keep
    t = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=v.expand_dim(0))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_squeeze_dim0_of_hbm_view(target):
    x = normal((4, 16), 209)
    assert np.array_equal(run(k_squeeze_hbm_dim0, target, x)[0], x[0])


def k_views_sbuf(x):
    """x: (128, 4, 8) in SBUF; views keep the partition dim first."""
    t = load(x)
    a = nl.ndarray((P, 8, 4), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=a, src=t.permute((0, 2, 1)))
    b = nl.ndarray((P, 32), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=t.flatten_dims(start_dim=1, end_dim=2))
    c = nl.ndarray((P, 2, 4), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c, src=t.slice(dim=2, start=1, end=5).slice(dim=1, start=1, end=3))
    col = t.select(dim=2, index=0).select(dim=1, index=3)  # (128,)
    d = nl.ndarray((P, 6), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=col.expand_dim(1).broadcast(dim=1, size=6))  # free-dim broadcast
    e = nl.ndarray((P, 4, 2, 4), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=e, src=t.reshape_dim(dim=2, shape=(2, -1)))
    f = nl.ndarray((P, 8), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=f, src=t.slice(dim=1, start=2, end=3).squeeze_dim(dim=1))
    return store(a), store(b), store(c), store(d), store(e), store(f)


@pytest.mark.parametrize("target", V3)
def test_view_methods_on_sbuf(target):
    x = normal((P, 4, 8), 211)
    a, b, c, d, e, f = run(k_views_sbuf, target, x)
    assert np.array_equal(a, x.transpose(0, 2, 1))
    assert np.array_equal(b, x.reshape(P, 32))
    assert np.array_equal(c, x[:, 1:3, 1:5])
    assert np.array_equal(d, np.broadcast_to(x[:, 3, 0:1], (P, 6)))
    assert np.array_equal(e, x.reshape(P, 4, 2, 4))
    assert np.array_equal(f, x[:, 2, :])


def k_get_pattern(x):
    t = load(x)
    pat = t.get_pattern()
    assert pat[0] == [x.shape[1], P] and pat[-1] == [1, x.shape[1]]
    hp = x.get_pattern()
    assert hp[0][1] == x.shape[0] and hp[-1] == [1, x.shape[1]]
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_get_pattern(target):
    x = normal((P, 24), 212)
    assert np.array_equal(run(k_get_pattern, target, x), x)


# ================================================================ constants
def k_shared_constant(x):
    c = nl.shared_constant(np.arange(P * 8, dtype=np.float32).reshape(P, 8), dtype=nl.float32)
    ident = nl.shared_constant(nki.tensor.identity(P, nl.float32))
    t = load(c)
    i = load(ident)
    u = load(x)
    r = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r, data1=t, data2=u, op=nl.add)
    ps = nl.ndarray((P, 8), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=i, moving=r)
    ib = load(nl.shared_identity_matrix(P))  # default dtype
    return evacuate(ps), store(ib, nl.float32)


@pytest.mark.parametrize("target", V2)
def test_shared_constant_and_identity(target):
    x = ints_as_f32((P, 8), -50, 50, 213)
    out, ib = run(k_shared_constant, target, x)
    assert np.array_equal(out, np.arange(P * 8, dtype=np.float32).reshape(P, 8) + x)
    assert np.array_equal(ib, np.eye(P, dtype=np.float32))


def k_identity_in_sbuf(x):
    """nl.shared_identity_matrix is an SBUF tile: engines read it directly; it keeps clear of a tile the
    kernel places at a low address; a second call returns the same tile."""
    placed = nl.ndarray((P, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
    nisa.memset(dst=placed, value=0.0)
    ident = nl.shared_identity_matrix(n=P, dtype=nl.float32)
    assert ident is nl.shared_identity_matrix(P, nl.float32) and ident.buffer is nl.sbuf
    r = nl.ndarray((P, P), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=ident, op0=nl.multiply, operand0=3.0)
    ps = nl.ndarray((P, 8), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=r, moving=load(x))
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_shared_identity_matrix_is_an_sbuf_tile(target):
    x = ints_as_f32((P, 8), -50, 50, 214)
    assert np.array_equal(run(k_identity_in_sbuf, target, x), 3 * x)


def test_tile_size_alignments():
    assert nl.tile_size.sbuf_min_align == 64 and nl.tile_size.psum_min_align == 64


def k_private_hbm_result(x):
    """Outputs allocated in nl.hbm, one returned as a whole-tensor view of another dtype."""
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.hbm)
    nisa.dma_copy(dst=out, src=load(x))
    bits = nl.ndarray(x.shape, nl.uint32, buffer=nl.hbm)
    nisa.dma_copy(dst=bits, src=load(x).view(nl.uint32))
    return out, bits.view(nl.int32)


@pytest.mark.parametrize("target", V3)
def test_kernels_return_private_hbm_tensors_and_views(target):
    x = normal((P, 8), 215)
    out, bits = run(k_private_hbm_result, target, x)
    assert np.array_equal(out, x) and bits.dtype == np.int32 and np.array_equal(bits, x.view(np.int32))


def k_language_broadcast_to(row):
    return store(nl.broadcast_to(load(row), (P, row.shape[1])))


@pytest.mark.parametrize("target", V3)
def test_language_broadcast_to(target):
    row = normal((1, 16), 216)
    assert np.array_equal(run(k_language_broadcast_to, target, row), np.repeat(row, P, axis=0))


def k_fills_and_logic(x, n):
    """The *_like constructors, nl.no_reorder, bitwise / logical negation and the prod / all / any
    reductions."""
    t, m = load(x), load(n)
    out = nl.ndarray((P, 7), nl.float32, buffer=nl.sbuf)
    with nl.no_reorder():
        ones = nl.ones_like(t)
        sevens = nl.full_like(t, 7.0)
        scratch = nl.empty_like(t)
        nisa.tensor_tensor(dst=scratch, data1=ones, data2=sevens, op=nl.add)  # 8
    nisa.tensor_copy(dst=out[:, 0:1], src=nl.sum(scratch, axis=1, keepdims=True))
    nisa.tensor_copy(dst=out[:, 1:2], src=nl.prod(t[:, 0:4], axis=1, keepdims=True))
    nisa.tensor_copy(dst=out[:, 2:3], src=nl.all(t, axis=1, keepdims=True))
    nisa.tensor_copy(dst=out[:, 3:4], src=nl.any(t, axis=1, keepdims=True))
    nisa.tensor_copy(dst=out[:, 4:5], src=nl.logical_not(t[:, 0:1]))
    inv = nl.invert(m)
    nisa.tensor_copy(dst=out[:, 5:6], src=inv[:, 0:1])
    nisa.tensor_copy(dst=out[:, 6:7], src=nl.negative(t[:, 1:2]))
    return store(out)


@pytest.mark.parametrize("target", V2)
def test_fills_negation_and_boolean_reductions(target):
    x = rng(271).integers(0, 3, size=(P, 16)).astype(np.float32)
    n = rng(272).integers(-1000, 1000, size=(P, 2)).astype(np.int32)
    got = run(k_fills_and_logic, target, x, n)
    assert np.array_equal(got[:, 0], np.full(P, 8.0 * 16))
    assert np.array_equal(got[:, 1], x[:, :4].prod(axis=1))
    assert np.array_equal(got[:, 2], (x != 0).all(axis=1).astype(np.float32))
    assert np.array_equal(got[:, 3], (x != 0).any(axis=1).astype(np.float32))
    assert np.array_equal(got[:, 4], (x[:, 0] == 0).astype(np.float32))
    assert np.array_equal(got[:, 5], (~n[:, 0]).astype(np.float32))
    assert np.array_equal(got[:, 6], -x[:, 1])


def test_finfo_and_static_cast():
    for dt, ref in ((nl.float32, np.float32), (nl.float16, np.float16)):
        info, want = nl.finfo(dt), np.finfo(ref)
        assert (info.max, info.min, info.eps, info.tiny) == (float(want.max), float(want.min), float(want.eps),
                                                           float(want.tiny))
    assert nl.finfo(nl.bfloat16).eps == 2.0**-7 and nl.finfo(nl.float8_e4m3fn).max == 448.0
    cast = nl.static_cast(np.array([1.7, -2.2]), nl.int32)
    assert cast.dtype == np.int32 and list(cast) == [1, -2]


def k_language_dropout(x):
    return store(nl.dropout(load(x), 0.25))


@pytest.mark.parametrize("target", V2)
def test_language_dropout(target):
    x = rng(273).uniform(1.0, 2.0, size=(P, 256)).astype(np.float32)
    got = run(k_language_dropout, target, x)
    kept = got != 0
    assert abs(1 - kept.mean() - 0.25) < 0.01 and np.array_equal(got[kept], x[kept])
