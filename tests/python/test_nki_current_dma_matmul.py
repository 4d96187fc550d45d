"""Current NKI API: DMA and the Tensor engine (dma_copy, dma_transpose,
dma_compute, nc_matmul, nc_transpose), each against numpy on trn2 / trn3
(trn1 where NeuronCore-v2 has the call)."""
import dataclasses
import math
import numpy as np
import pytest
import torch
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


# ================================================================ data movement
def k_dma_round_trip(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)  # positional (dst, src)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8])
def test_dma_copy_round_trip_is_bit_exact(target, dtype):
    x = rng(1).integers(0, 250, size=(P, 96)).astype(dtype)
    if dtype in (np.float32, np.float16):
        x = normal((P, 96), 1).astype(dtype)
    got = run(k_dma_round_trip, target, x)
    assert got.dtype == dtype and np.array_equal(got.view(np.uint8), x.view(np.uint8))


def k_dma_rmw_add(acc_in, x):
    out = nl.ndarray(acc_in.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc_in)  # HBM -> HBM
    t = load(x)
    nisa.dma_copy(dst=out, src=t, dst_rmw_op=nl.add)  # out += t
    nisa.dma_copy(dst=out, src=t, dst_rmw_op=nl.add, oob_mode=nisa.oob_mode.error)
    # and into SBUF
    s = load(acc_in)
    nisa.dma_copy(dst=s, src=x, dst_rmw_op=nl.add)
    out2 = store(s)
    return out, out2


@pytest.mark.parametrize("target", V2)
def test_dma_copy_dst_rmw_add(target):
    a, x = normal((P, 64), 2), normal((P, 64), 3)
    out, out2 = run(k_dma_rmw_add, target, a, x)
    assert np.array_equal(out, (a + x) + x)
    assert np.array_equal(out2, a + x)


def k_dma_modes(x):
    out = nl.ndarray((P, 6 * 32), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 6 * 32), nl.float32, buffer=nl.sbuf)
    modes = [nisa.dge_mode.unknown, nisa.dge_mode.none, nisa.dge_mode.swdge, nisa.dge_mode.hwdge, 3, 0]
    for i, m in enumerate(modes):
        nisa.dma_copy(dst=t[:, i * 32:(i + 1) * 32], src=x[:, i * 32:(i + 1) * 32], dge_mode=m)
    engines = [nisa.engine.sync, nisa.engine.scalar, nisa.engine.gpsimd, nisa.engine.dma]
    half = nl.ndarray((P, 6 * 32), nl.float32, buffer=nl.sbuf)
    for i in range(6):
        nisa.dma_copy(dst=half[:, nl.ds(i * 32, 32)], src=t[:, nl.ds(i * 32, 32)],
                      engine=engines[i % len(engines)])
    nisa.dma_copy(dst=out, src=half, oob_mode=nisa.oob_mode.skip, dge_mode=nisa.dge_mode.none, name="store_out")
    return out


@pytest.mark.parametrize("target", V3)
def test_dma_copy_accepts_dge_modes_engines_and_oob_mode(target):
    x = normal((P, 192), 4)
    assert np.array_equal(run(k_dma_modes, target, x), x)


def k_dma_cast(x_f32, i32):
    a = nl.ndarray(x_f32.shape, nl.bfloat16, buffer=nl.shared_hbm)
    t = load(x_f32)
    nisa.dma_copy(dst=a, src=t)  # f32 SBUF -> bf16 HBM
    f = nl.ndarray(i32.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=i32)  # int32 HBM -> f32 SBUF
    return a, store(f)


@pytest.mark.parametrize("target", V3)
def test_dma_copy_casts_through_fp32(target):
    x = normal((P, 64), 5)
    i = rng(5).integers(-1000, 1000, size=(P, 16)).astype(np.int32)
    a, f = run(k_dma_cast, target, x, i)
    assert np.array_equal(nki.to_float32(a), bf16_round(x))
    assert np.array_equal(f, i.astype(np.float32))


def k_dma_transpose(x):
    r, c = x.shape
    out = nl.ndarray((c, r), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((c, r), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def k_dma_transpose_axes(x):
    r, c = x.shape
    out = nl.ndarray((c, r), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((c, r), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x, axes=(1, 0), dge_mode=nisa.dge_mode.unknown)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("kernel", [k_dma_transpose, k_dma_transpose_axes])
def test_dma_transpose_2byte(target, kernel):
    x = normal((32, 128), 6).astype(np.float16)
    got = run(kernel, target, x)
    assert got.dtype == np.float16 and np.array_equal(got, x.T)


def k_dma_transpose_bf16(x):
    r, c = x.shape
    out = nl.ndarray((c, r), nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.ndarray((c, r), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(t, x)
    nisa.dma_copy(out, t)
    return out


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_bf16_torch(target):
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = run(k_dma_transpose_bf16, target, x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, x.T.contiguous())


def k_dma_transpose_hwdge(x):
    r, c = x.shape
    t = nl.ndarray((c, r), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_moves_4_byte_types_but_not_on_the_hardware_dge(target):
    x = normal((64, 128), 7)
    assert np.array_equal(run(k_dma_transpose, target, x), x.T)
    with pytest.raises(ValueError, match="hwdge.*2-byte"):
        run(k_dma_transpose_hwdge, target, x)
    h = x.astype(np.float16)
    assert np.array_equal(run(k_dma_transpose_hwdge, target, h), h.T)


def k_dma_transpose_blocks(x):
    """attention's 4-D exp-tile transpose: src [P, 1, C, 128] -> dst [128, 1, C, P] (one plane per block)."""
    P, F = x.shape
    C = F // 128
    s = load(x)
    t = nl.ndarray((128, C * P), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t.ap([[C * P, 128], [1, 1], [P, C], [1, P]]),
                       src=s.ap([[F, P], [1, 1], [128, C], [1, 128]]), axes=(3, 1, 2, 0))
    return store(t)


def k_dma_transpose_3d(x):
    """[A, B, C] -> [C, B, A] (axes (2, 1, 0)) from HBM."""
    A, B, C = x.shape
    t = nl.ndarray((C, B, A), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x)
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_with_middle_dims(target):
    x = normal((64, 384), 8).astype(np.float16)
    got = run(k_dma_transpose_blocks, target, x)
    assert np.array_equal(got, x.reshape(64, 3, 128).transpose(2, 1, 0).reshape(128, 192))
    y = normal((32, 3, 16), 9).astype(np.float16)
    assert np.array_equal(run(k_dma_transpose_3d, target, y), y.transpose(2, 1, 0))


def k_dma_transpose_indirect(blocks, idx):
    """Block-KV attention: the blocks named by a uint32 index column, gathered and transposed
    ([P, 1, L, D] -> [D, 1, L, P], dge_mode=swdge)."""
    N, _, L, D = blocks.shape
    i = load(idx)
    P_ = idx.shape[0]
    t = nl.ndarray((D, 1, L, P_), blocks.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=blocks.ap([[L * D, P_], [1, 1], [D, L], [1, D]], offset=0, vector_offset=i,
                                            indirect_dim=0), axes=(3, 1, 2, 0), dge_mode=nisa.dge_mode.swdge)
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_of_indirect_rows(target):
    blocks = normal((48, 1, 4, 16), 10).astype(np.float16)
    idx = rng(11).permutation(48)[:32].astype(np.uint32).reshape(32, 1)
    got = run(k_dma_transpose_indirect, target, blocks, idx)
    assert np.array_equal(got, blocks[idx[:, 0]].transpose(3, 1, 2, 0))


def k_activation_permuted_views(x):
    """Scalar / Vector operands that are permuted views ([P, 8, 4] seen as [P, 4, 8])."""
    P_, A, B = x.shape
    a = load(x)
    b = nl.ndarray((P_, B, A), x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=b.permute(dims=[0, 2, 1]), data=a, op=nl.exp)
    c = nl.ndarray((P_, B, A), x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=c, data=b, op0=nl.multiply, operand0=2.0)
    return store(c)


@pytest.mark.parametrize("target", V3)
def test_engine_operands_may_be_permuted_views(target):
    x = normal((P, 4, 8), 12)
    got = run(k_activation_permuted_views, target, x)
    want = (np.exp(x.astype(np.float32)) * np.float32(2)).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=2e-6)


def k_dma_compute(a, b):
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_compute(dst=out, srcs=[a, b], scales=[1.0, 1.0], reduce_op=nl.add)  # HBM + HBM -> HBM
    s = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_compute(dst=s, srcs=[a, b, out], scales=[1.0, 1.0, 1.0], reduce_op=nl.add)  # -> SBUF
    return out, store(s)


@pytest.mark.parametrize("target", V3)
def test_dma_compute_adds_sources(target):
    a, b = normal((P, 64), 7), normal((P, 64), 8)
    out, s = run(k_dma_compute, target, a, b)
    assert np.array_equal(out, a + b)
    assert np.array_equal(s, (a + b) + (a + b))


# ================================================================ Tensor engine
def k_matmul_k_loop(lhsT, rhs):
    """result = lhsT.T @ rhs, K = 256 in two 128-row chunks accumulated in one
    freshly declared PSUM tile (accumulate left to the default)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // P):
        a = nl.ndarray((P, M), lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((P, N), rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * P:(k + 1) * P, :])
        nisa.dma_copy(dst=b, src=rhs[nl.ds(k * P, P), :])
        nisa.nc_matmul(ps, a, b)
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_nc_matmul_accumulates_over_k_by_default(target):
    a, b = ints_as_f32((256, 64), seed=1), ints_as_f32((256, 96), seed=2)
    assert np.array_equal(run(k_matmul_k_loop, target, a, b), a.T @ b)


def k_matmul_accumulate_flags(lhsT, rhs):
    M, N = lhsT.shape[1], rhs.shape[1]
    a, b = load(lhsT), load(rhs)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=a, moving=b, accumulate=False)
    nisa.nc_matmul(dst=ps, stationary=a, moving=b, accumulate=True)  # 2 a.T b
    nisa.nc_matmul(dst=ps, stationary=a, moving=b, accumulate=True)  # 3 a.T b
    first = evacuate(ps)
    nisa.nc_matmul(dst=ps, stationary=a, moving=b, accumulate=False)  # overwrites: a.T b
    second = evacuate(ps)
    ps2 = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps2, stationary=a, moving=b)  # a fresh tile: the first matmul overwrites
    nisa.nc_matmul(dst=ps2, stationary=a, moving=b, accumulate=None)
    return first, second, evacuate(ps2)


@pytest.mark.parametrize("target", V2)
def test_nc_matmul_accumulate_true_false_none(target):
    a, b = ints_as_f32((P, 32), seed=3), ints_as_f32((P, 128), seed=4)
    first, second, third = run(k_matmul_accumulate_flags, target, a, b)
    ref = a.T @ b
    assert np.array_equal(first, 3 * ref)
    assert np.array_equal(second, ref)
    assert np.array_equal(third, 2 * ref)


def k_matmul_hints(lhsT, rhs):
    M, N = lhsT.shape[1], rhs.shape[1]
    a, b = load(lhsT), load(rhs)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=a, moving=b, is_stationary_onezero=False, is_moving_onezero=True,
                   tile_position=(0, 0), tile_size=(128, 128), perf_mode=nisa.matmul_perf_mode.none,
                   name="mm")
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_nc_matmul_accepts_tiling_and_perf_hints(target):
    a = ints_as_f32((P, 64), seed=5)
    b = rng(6).integers(0, 2, size=(P, 256)).astype(np.float32)
    assert np.array_equal(run(k_matmul_hints, target, a, b), a.T @ b)


def k_matmul_tile_position(lhsT, rhs):
    """Two 64-row matmuls placed on the two row halves of the PE array,
    each writing its own half of dst's partitions (K = 64 each)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    a, b = load(lhsT), load(rhs)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps[0:M, :], stationary=a[0:64, :], moving=b[0:64, :],
                   tile_position=(0, 0), tile_size=(64, 128))
    nisa.nc_matmul(dst=ps[0:M, :], stationary=a[64:128, :], moving=b[64:128, :],
                   tile_position=(64, 0), tile_size=(64, 128))
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_nc_matmul_row_tiles_accumulate(target):
    a, b = ints_as_f32((P, 64), seed=7), ints_as_f32((P, 128), seed=8)
    assert np.array_equal(run(k_matmul_tile_position, target, a, b), a.T @ b)


def k_matmul_bf16(lhsT, rhs):
    M, N = lhsT.shape[1], rhs.shape[1]
    a = nl.ndarray(lhsT.shape, nl.bfloat16, buffer=nl.sbuf)
    b = nl.ndarray(rhs.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    nisa.dma_copy(dst=b, src=rhs)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=a, moving=b)
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_nc_matmul_bf16_operands_fp32_psum(target):
    a, b = ints_as_f32((P, 128), seed=9), ints_as_f32((P, 512), seed=10)
    assert np.array_equal(run(k_matmul_bf16, target, a, b), a.T @ b)


def k_matmul_double_row(lhsT, rhs):
    """FP8 double-row mode: stationary [128, 2, M], moving [128, 2, N]
    (float8_e4m3 on trn2, float8_e4m3fn on trn3)."""
    M, N = lhsT.shape[2], rhs.shape[2]
    fp8 = nl.float8_e4m3fn if nisa.get_nc_version() >= nisa.nc_version.gen4 else nl.float8_e4m3
    a = nl.ndarray(lhsT.shape, fp8, buffer=nl.sbuf)
    b = nl.ndarray(rhs.shape, fp8, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    nisa.dma_copy(dst=b, src=rhs)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(ps, a, b, perf_mode=nisa.matmul_perf_mode.double_row)
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_nc_matmul_double_row_fp8(target):
    a = rng(11).integers(-3, 4, size=(P, 2, 16)).astype(np.float32)
    b = rng(12).integers(-3, 4, size=(P, 2, 64)).astype(np.float32)
    ref = np.einsum("kjm,kjn->mn", a, b)
    assert np.array_equal(run(k_matmul_double_row, target, a, b), ref)


def k_transpose_via_matmul(x):
    """is_transpose=True with an identity moving operand (bit-accurate PE transpose)."""
    r, c = x.shape
    t = load(x)
    ident = nl.ndarray((r, r), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ident, src=nl.shared_identity_matrix(r, dtype=x.dtype))
    ps = nl.ndarray((c, r), x.dtype, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=t, moving=ident, is_transpose=True)
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_nc_matmul_is_transpose(target):
    x = normal((64, 128), 13)
    x[0, :4] = [np.inf, -np.inf, 1e-40, -0.0]
    got = run(k_transpose_via_matmul, target, x)
    assert np.array_equal(got.view(np.uint32), x.T.copy().view(np.uint32))


def k_identity_matmul(x):
    """shared_identity_matrix as a matmul operand: I.T @ x == x (exact in fp32)."""
    n = x.shape[0]
    ident = load(nl.shared_identity_matrix(n, dtype=nl.float32))
    t = load(x)
    ps = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=ident, moving=t)
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_shared_identity_matrix_as_matmul_operand(target):
    x = ints_as_f32((P, 200), -100, 100, seed=14)
    assert np.array_equal(run(k_identity_matmul, target, x), x)


def k_nc_transpose_pe(x):
    r, c = x.shape
    t = load(x)
    ps = nl.ndarray((c, r), x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=t)
    ps2 = nl.ndarray((c, r), x.dtype, buffer=nl.psum)
    nisa.nc_transpose(ps2, t, engine=nisa.engine.tensor)
    return evacuate(ps), evacuate(ps2)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("shape", [(128, 64), (1, 128), (100, 1), (128, 128)])
def test_nc_transpose_tensor_engine(target, shape):
    x = normal(shape, 15)
    a, b = run(k_nc_transpose_pe, target, x)
    assert np.array_equal(a, x.T) and np.array_equal(b, x.T)


def k_nc_transpose_vector(x):
    r, c = x.shape
    t = load(x)
    s = nl.ndarray((c, r), x.dtype, buffer=nl.sbuf)
    nisa.nc_transpose(dst=s, data=t, engine=nisa.vector_engine)
    return store(s)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("shape", [(32, 32), (16, 32), (32, 8)])
def test_nc_transpose_vector_engine(target, shape):
    x = normal(shape, 16)
    assert np.array_equal(run(k_nc_transpose_vector, target, x), x.T)


def k_transpose_index_columns(src, idx):
    """A gather-transpose of 128 * n rows from a [128, n] index tile (row c * 128 + i is idx[i, c])."""
    R, V = src.shape
    n = idx.shape[1]
    i = load(idx)
    t = nl.ndarray((V, 1, 1, 128 * n), src.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=src.reshape((R, 1, 1, V)).ap([[V, 128 * n], [1, 1], [1, 1], [1, V]],
                                                              vector_offset=i), axes=(3, 1, 2, 0))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_with_an_index_tile_of_several_columns(target):
    src = normal((400, 32), 14).astype(np.float16)
    perm = rng(15).permutation(400)[:256].astype(np.uint32)
    got = run(k_transpose_index_columns, target, src, perm.reshape(2, 128).T.copy())
    assert np.array_equal(got[:, 0, 0, :], src[perm].T)


def k_matmul_partial_then_whole(a, b):
    """accumulate=None per PSUM location: a matmul into columns 0:4, then one into all 16 columns
    (accumulating onto 0:4, writing 4:16), as padded convolutions do."""
    sa, sb = load(a), load(b)
    ps = nl.ndarray((a.shape[1], 16), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps[:, 0:4], stationary=sa, moving=sb[:, 0:4])
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_matmul_accumulates_per_psum_location(target):
    a, b = ints_as_f32((P, 32), -3, 3, 16), ints_as_f32((P, 16), -3, 3, 17)
    got = run(k_matmul_partial_then_whole, target, a, b)
    want = 2 * (a.T @ b)
    want[:, 0:4] += a.T @ b[:, 0:4]
    assert np.array_equal(got, want)


def k_matmul_into_strided_view(a, b):
    """The output is every other column of a [M, 2, 8] PSUM tile (a 3-D strided view)."""
    ps = nl.ndarray((a.shape[1], 8, 2), nl.float32, buffer=nl.psum)
    nisa.memset(dst=ps, value=0.0)
    nisa.nc_matmul(dst=ps[:, :, 1], stationary=load(a), moving=load(b), accumulate=False)
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_matmul_into_a_strided_psum_view(target):
    a, b = ints_as_f32((P, 16), -3, 3, 18), ints_as_f32((P, 8), -3, 3, 19)
    got = run(k_matmul_into_strided_view, target, a, b)
    assert np.array_equal(got[:, :, 1], a.T @ b) and not got[:, :, 0].any()


def k_matmul_strided_partial(a, b):
    """conv3d's padded taps: a matmul into a strided [M, 2, 3] window of a [M, 2, 4] PSUM tile, then
    one into the whole tile (accumulating onto the window, writing the rest)."""
    sa, sb = load(a), load(b)
    ps = nl.ndarray((a.shape[1], 2, 4), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps[:, :, 1:4], stationary=sa, moving=sb[:, 0:6])
    nisa.nc_matmul(dst=ps, stationary=sa, moving=sb)
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_matmul_accumulates_onto_a_strided_window(target):
    a, b = ints_as_f32((P, 32), -3, 3, 20), ints_as_f32((P, 8), -3, 3, 21)
    got = run(k_matmul_strided_partial, target, a, b).reshape(32, 2, 4)
    want = (a.T @ b).reshape(32, 2, 4)
    want[:, :, 1:4] += (a.T @ b[:, 0:6]).reshape(32, 2, 3)
    assert np.array_equal(got, want)
