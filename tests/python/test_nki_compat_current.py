"""Compatibility suite for the current NKI API generation (`import nki;
import nki.language as nl; import nki.isa as nisa`, NKI 0.2+): one small
kernel per nki.isa call and per argument public kernels pass, written the
way AWS's nki-library kernels are (explicit dst= tiles, nl.ndarray with a
buffer, nisa.dma_copy in and out, shared_hbm outputs), each checked against
numpy / torch on trn2 and trn3 (and trn1 where NeuronCore-v2 has the
instruction). Bit-exact where the arithmetic is defined; transcendental
activations within a stated tolerance of float32 numpy."""
import dataclasses
import math

import numpy as np
import pytest
import torch

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl

V2 = ["trn1", "trn2", "trn3"]  # instructions NeuronCore-v2 has
V3 = ["trn2", "trn3"]  # NeuronCore-v3+ instructions (and the default sweep)
P = 128


def run(kernel, target, *args, **kwargs):
    return nki.jit(kernel, platform_target=target)(*args, **kwargs)


def rng(seed):
    return np.random.default_rng(seed)


def ints_as_f32(shape, lo=-8, hi=8, seed=0):
    """Small integer values in float32: sums and products stay exact."""
    return rng(seed).integers(lo, hi, size=shape).astype(np.float32)


def normal(shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def bf16_round(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, via torch."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def load(src, dtype=None):
    """HBM -> a fresh SBUF tile (the library's dma_copy idiom)."""
    t = nl.ndarray(src.shape, dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def store(tile, dtype=None):
    """An SBUF tile -> a new shared_hbm output."""
    out = nl.ndarray(tile.shape, dtype or tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def evacuate(ps):
    """A PSUM tile -> SBUF (tensor_copy) -> a shared_hbm output."""
    sb = nl.ndarray(ps.shape, ps.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=ps)
    return store(sb)


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


# ================================================================ Vector engine: elementwise
def k_tensor_tensor(a, b, op, out_dtype, engine):
    x, y = load(a), load(b)
    r = nl.ndarray(a.shape, out_dtype, buffer=nl.sbuf)
    if engine is None:
        nisa.tensor_tensor(dst=r, data1=x, data2=y, op=op)
    else:
        nisa.tensor_tensor(r, x, y, op, engine=engine)
    return store(r)


FLOAT_TT = [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply),
    (nl.maximum, np.maximum), (nl.minimum, np.minimum),
]
CMP_TT = [
    (nl.equal, np.equal), (nl.not_equal, np.not_equal), (nl.greater, np.greater),
    (nl.greater_equal, np.greater_equal), (nl.less, np.less), (nl.less_equal, np.less_equal),
]


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("op,ref", FLOAT_TT, ids=lambda o: getattr(o, "name", getattr(o, "__name__", "")))
def test_tensor_tensor_arithmetic_fp32_exact(target, op, ref):
    a, b = normal((P, 256), 20), normal((P, 256), 21)
    got = run(k_tensor_tensor, target, a, b, op, nl.float32, None)
    assert np.array_equal(got, ref(a, b))


@pytest.mark.parametrize("target", V3)
def test_tensor_tensor_divide(target):
    a, b = normal((P, 256), 22), normal((P, 256), 23) + np.float32(4.0)
    got = run(k_tensor_tensor, target, a, b, nl.divide, nl.float32, None)
    np.testing.assert_allclose(got, a / b, rtol=1e-6, atol=0)


@pytest.mark.parametrize("target", V3)
def test_tensor_tensor_power_on_gpsimd(target):
    a = rng(24).uniform(0.5, 2.0, size=(P, 64)).astype(np.float32)
    b = rng(25).uniform(-2.0, 2.0, size=(P, 64)).astype(np.float32)
    got = run(k_tensor_tensor, target, a, b, nl.power, nl.float32, nisa.engine.gpsimd)
    np.testing.assert_allclose(got, np.power(a, b), rtol=1e-6, atol=0)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("op,ref", CMP_TT, ids=lambda o: getattr(o, "name", getattr(o, "__name__", "")))
@pytest.mark.parametrize("out", ["float32", "uint8"])
def test_tensor_tensor_comparisons(target, op, ref, out):
    a, b = ints_as_f32((P, 128), -3, 3, 26), ints_as_f32((P, 128), -3, 3, 27)
    got = run(k_tensor_tensor, target, a, b, op, out, None)
    assert got.dtype == np.dtype(out) and np.array_equal(got, ref(a, b).astype(out))


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("op,ref", [(nl.logical_and, np.logical_and), (nl.logical_or, np.logical_or),
                                    (nl.logical_xor, np.logical_xor)], ids=["and", "or", "xor"])
def test_tensor_tensor_logical_on_0_1(target, op, ref):
    a = rng(28).integers(0, 2, size=(P, 64)).astype(np.float32)
    b = rng(29).integers(0, 2, size=(P, 64)).astype(np.float32)
    got = run(k_tensor_tensor, target, a, b, op, nl.float32, None)
    assert np.array_equal(got, ref(a, b).astype(np.float32))


BIT_TT = [(nl.bitwise_and, np.bitwise_and), (nl.bitwise_or, np.bitwise_or), (nl.bitwise_xor, np.bitwise_xor)]


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("op,ref", BIT_TT, ids=["and", "or", "xor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.uint16, np.int8])
def test_tensor_tensor_bitwise_on_raw_bits(target, op, ref, dtype):
    info = np.iinfo(dtype)
    a = rng(30).integers(info.min, info.max, size=(P, 64), dtype=dtype, endpoint=True)
    b = rng(31).integers(info.min, info.max, size=(P, 64), dtype=dtype, endpoint=True)
    got = run(k_tensor_tensor, target, a, b, op, np.dtype(dtype).name, None)
    assert got.dtype == dtype and np.array_equal(got, ref(a, b))


@pytest.mark.parametrize("target", V2)
def test_tensor_tensor_shifts_uint32(target):
    a = rng(32).integers(0, 2**32, size=(P, 64), dtype=np.uint32)
    s = rng(33).integers(0, 32, size=(P, 64), dtype=np.uint32)
    left = run(k_tensor_tensor, target, a, s, nl.left_shift, nl.uint32, None)
    right = run(k_tensor_tensor, target, a, s, nl.right_shift, nl.uint32, None)
    assert np.array_equal(left, (a.astype(np.uint64) << s.astype(np.uint64)).astype(np.uint32))
    assert np.array_equal(right, a >> s)


@pytest.mark.parametrize("target", V3)
def test_tensor_tensor_right_shift_is_logical_on_int32(target):
    a = rng(34).integers(-2**31, 2**31, size=(P, 32), dtype=np.int64).astype(np.int32)
    s = rng(35).integers(0, 32, size=(P, 32)).astype(np.int32)
    got = run(k_tensor_tensor, target, a, s, nl.right_shift, nl.int32, None)
    want = (a.view(np.uint32) >> s.view(np.uint32)).view(np.int32)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", V2)
def test_tensor_tensor_int32_small_values_vector(target):
    a = rng(36).integers(-2**20, 2**20, size=(P, 64)).astype(np.int32)
    b = rng(37).integers(-2**20, 2**20, size=(P, 64)).astype(np.int32)
    got = run(k_tensor_tensor, target, a, b, nl.add, nl.int32, None)
    assert np.array_equal(got, a + b)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("op,ref", [(nl.add, np.add), (nl.subtract, np.subtract)], ids=["add", "sub"])
def test_tensor_tensor_int32_gpsimd_is_integer_exact(target, op, ref):
    a = rng(38).integers(-2**30, 2**30, size=(P, 64)).astype(np.int32)
    b = rng(39).integers(-2**30, 2**30, size=(P, 64)).astype(np.int32)
    got = run(k_tensor_tensor, target, a, b, op, nl.int32, nisa.engine.gpsimd)
    assert np.array_equal(got, ref(a, b))


@pytest.mark.parametrize("target", V3)
def test_tensor_tensor_mixed_dtypes_and_psum_operand(target):
    def kernel(a, b):
        x = load(a, nl.bfloat16)
        ps = nl.ndarray(b.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=load(b))
        r = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=ps, data2=x, op=nl.add)  # PSUM + SBUF
        return store(r)

    a, b = normal((P, 64), 40), normal((P, 64), 41)
    assert np.array_equal(run(kernel, target, a, b), b + bf16_round(a))


def k_tensor_scalar_forms(x, col):
    t, c = load(x), load(col)
    out = nl.ndarray((P, 8, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.multiply, operand0=2.0)
    nisa.tensor_scalar(out[:, 1, :], t, nl.multiply, 3.0, False, nl.add, -0.5, False)  # 8 positional
    nisa.tensor_scalar(dst=out[:, 2, :], data=t, op0=nl.subtract, operand0=c)  # [P, 1] column
    nisa.tensor_scalar(dst=out[:, 3, :], data=t, op0=nl.subtract, operand0=1.5, reverse0=True)  # 1.5 - x
    nisa.tensor_scalar(dst=out[:, 4, :], data=t, op0=nl.add, operand0=c, op1=nl.subtract, operand1=c[:, 0],
                       reverse1=True)  # c - (x + c)
    nisa.tensor_scalar(dst=out[:, 5, :], data=t, op0=nl.maximum, operand0=0.0, op1=nl.minimum, operand1=1.0,
                       engine=nisa.engine.vector)
    nisa.tensor_scalar(dst=out[:, 6, :], data=t, op0=nl.multiply, operand0=c, op1=nl.add, operand1=2.0,
                       engine=nisa.engine.scalar)
    nisa.tensor_scalar(dst=out[:, 7, :], data=t, op0=nl.subtract, operand0=c, reverse0=True, op1=nl.multiply,
                       operand1=4.0)  # (c - x) * 4
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_operand_forms(target):
    x, col = normal((P, 64), 50), normal((P, 1), 51)
    got = run(k_tensor_scalar_forms, target, x, col)
    f = np.float32
    want = [x * f(2), x * f(3) + f(-0.5), x - col, f(1.5) - x, col - (x + col), np.clip(x, 0, 1),
            x * col + f(2), (col - x) * f(4)]
    for i, w in enumerate(want):
        assert np.array_equal(got[:, i, :], w), i


def k_bitwise_big_immediate(x):
    t = load(x)
    out = nl.ndarray((P, 2, x.shape[1]), nl.uint32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.bitwise_and, operand0=0x7FFFFFFF)
    nisa.tensor_scalar(dst=out[:, 1, :], data=t, op0=nl.bitwise_xor, operand0=0x12345679)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_bitwise_immediates_above_2_24(target):
    x = rng(49).integers(0, 2**32, size=(P, 32), dtype=np.uint32)
    got = run(k_bitwise_big_immediate, target, x)
    assert np.array_equal(got[:, 0], x & 0x7FFFFFFF)
    assert np.array_equal(got[:, 1], x ^ 0x12345679)


def k_chained_shifts(x):
    t = load(x)
    out = nl.ndarray(x.shape, nl.uint32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.left_shift, operand0=1, op1=nl.right_shift, operand1=1)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_chained_bitwise_ops_stay_32_bit(target):
    x = np.array([[0x80000001, 0xC0000003, 0x7FFFFFFF, 5]], dtype=np.uint32)
    assert np.array_equal(run(k_chained_shifts, target, x), x & 0x7FFFFFFF)


def k_tensor_scalar_cmp(x):
    t = load(x)
    out = nl.ndarray((P, 3, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.not_equal, operand0=0.0)
    nisa.tensor_scalar(dst=out[:, 1, :], data=t, op0=nl.less, operand0=-1.0, op1=nl.multiply, operand1=5.0,
                       engine=nisa.engine.vector)
    nisa.tensor_scalar(dst=out[:, 2, :], data=t, op0=nl.greater_equal, operand0=2.0, reverse0=True)  # 2 >= x
    return store(out)


@pytest.mark.parametrize("target", V2)
def test_tensor_scalar_comparisons_give_0_1(target):
    x = ints_as_f32((P, 64), -4, 4, 52)
    got = run(k_tensor_scalar_cmp, target, x)
    assert np.array_equal(got[:, 0], (x != 0).astype(np.float32))
    assert np.array_equal(got[:, 1], (x < -1).astype(np.float32) * 5)
    assert np.array_equal(got[:, 2], (2 >= x).astype(np.float32))


def k_tensor_scalar_int(x):
    t = load(x)
    out = nl.ndarray((P, 4, x.shape[1]), nl.uint32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.bitwise_and, operand0=0xFF)
    nisa.tensor_scalar(dst=out[:, 1, :], data=t, op0=nl.right_shift, operand0=8, op1=nl.bitwise_and,
                       operand1=0xF)
    nisa.tensor_scalar(dst=out[:, 2, :], data=t, op0=nl.left_shift, operand0=4, op1=nl.bitwise_or,
                       operand1=3)
    nisa.tensor_scalar(out[:, 3, :], t, nl.add, 7)  # an integer operand
    return store(out)


@pytest.mark.parametrize("target", V2)
def test_tensor_scalar_bitwise_on_uint32(target):
    x = rng(53).integers(0, 2**20, size=(P, 64), dtype=np.uint32)
    got = run(k_tensor_scalar_int, target, x)
    assert np.array_equal(got[:, 0], x & 0xFF)
    assert np.array_equal(got[:, 1], (x >> 8) & 0xF)
    assert np.array_equal(got[:, 2], ((x << 4) | 3).astype(np.uint32))
    assert np.array_equal(got[:, 3], x + 7)


def k_tensor_scalar_engines(x):
    t = load(x)
    out = nl.ndarray((P, 3, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.multiply, operand0=0.25, op1=nl.add, operand1=1.0,
                       engine=nisa.scalar_engine)
    nisa.tensor_scalar(dst=out[:, 1, :], data=t, op0=nl.add, operand0=-3.0, engine=nisa.gpsimd_engine)
    nisa.tensor_scalar(dst=out[:, 2, :], data=t, op0=nl.multiply, operand0=-1.0, engine=nisa.engine.unknown)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_engine_argument(target):
    x = normal((P, 64), 54)
    got = run(k_tensor_scalar_engines, target, x)
    assert np.array_equal(got[:, 0], x * np.float32(0.25) + np.float32(1))
    assert np.array_equal(got[:, 1], x - np.float32(3))
    assert np.array_equal(got[:, 2], -x)


def k_tensor_scalar_abs(x):
    t = load(x)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.abs, operand0=0.0)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_abs(target):
    x = normal((P, 64), 55)
    assert np.array_equal(run(k_tensor_scalar_abs, target, x), np.abs(x))


def k_tensor_scalar_rsqrt(x):
    t = load(x)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_rsqrt_on_gpsimd(target):
    x = rng(55).uniform(0.1, 10.0, size=(P, 64)).astype(np.float32)
    np.testing.assert_allclose(run(k_tensor_scalar_rsqrt, target, x), 1 / np.sqrt(x), rtol=1e-6)


def k_stt(x, col, y):
    t, c, u = load(x), load(col), load(y)
    out = nl.ndarray((P, 4, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=out[:, 0, :], data=t, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=u)
    nisa.scalar_tensor_tensor(dst=out[:, 1, :], data=t, op0=nl.subtract, operand0=c, op1=nl.multiply,
                              operand1=u)
    nisa.scalar_tensor_tensor(dst=out[:, 2, :], data=t, op0=nl.subtract, operand0=c, op1=nl.subtract,
                              operand1=u, reverse0=True, reverse1=True)  # u - (c - x)
    nisa.scalar_tensor_tensor(dst=out[:, 3, :], data=t, op0=nl.add, operand0=1.0, op1=nl.maximum,
                              operand1=u, reverse0=False, reverse1=False)
    return store(out)


@pytest.mark.parametrize("target", V2)
def test_scalar_tensor_tensor(target):
    x, col, y = normal((P, 64), 56), normal((P, 1), 57), normal((P, 64), 58)
    got = run(k_stt, target, x, col, y)
    f = np.float32
    assert np.array_equal(got[:, 0], x * f(3) + y)
    assert np.array_equal(got[:, 1], (x - col) * y)
    assert np.array_equal(got[:, 2], y - (col - x))
    assert np.array_equal(got[:, 3], np.maximum(x + f(1), y))


def k_tsr(x, col):
    t, c = load(x), load(col)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 4), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.add,
                              reduce_res=res[:, 0:1])
    nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum,
                              reduce_res=res[:, 1:2])
    nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.add, operand0=c, reduce_op=nl.minimum,
                              reduce_res=res[:, 2])
    d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(d2, t, nl.subtract, 1.0, nl.maximum, res[:, 3:4])
    return store(d), store(res)


@pytest.mark.parametrize("target", V2)
def test_tensor_scalar_reduce(target):
    x, col = ints_as_f32((P, 96), -50, 50, 59), ints_as_f32((P, 1), -5, 5, 60)
    d, res = run(k_tsr, target, x, col)
    assert np.array_equal(d, x + col)
    assert np.array_equal(res[:, 0], (2 * x).sum(axis=1))
    assert np.array_equal(res[:, 1], np.abs(x).max(axis=1))
    assert np.array_equal(res[:, 2], (x + col).min(axis=1))
    assert np.array_equal(res[:, 3], (x - 1).max(axis=1))


# ================================================================ reductions
def k_tensor_reduce_2d(x):
    t = load(x)
    res = nl.ndarray((P, 5), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(res[:, 0:1], nl.add, t, axis=1)  # positional (dst, op, data, axis)
    nisa.tensor_reduce(dst=res[:, 1:2], op=nl.maximum, data=t, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=res[:, 2], op=nl.minimum, data=t, axis=[1])
    nisa.tensor_reduce(dst=res[:, 3:4], op=nl.add, data=t, axis=(1,), negate=True)
    nisa.tensor_reduce(dst=res[:, 4:5], op=nl.maximum, data=t, axis=1, negate=True, keepdims=False)
    return store(res)


@pytest.mark.parametrize("target", V2)
def test_tensor_reduce_2d_ops_negate_keepdims(target):
    x = ints_as_f32((P, 200), -1000, 1000, 70)
    got = run(k_tensor_reduce_2d, target, x)
    assert np.array_equal(got[:, 0], x.sum(axis=1))
    assert np.array_equal(got[:, 1], x.max(axis=1))
    assert np.array_equal(got[:, 2], x.min(axis=1))
    assert np.array_equal(got[:, 3], -x.sum(axis=1))
    assert np.array_equal(got[:, 4], -x.max(axis=1))


def k_tensor_reduce_3d(x):
    t = load(x)
    a, b = x.shape[1], x.shape[2]
    last1 = nl.ndarray((P, a), nl.float32, buffer=nl.sbuf)
    last2 = nl.ndarray((P, a), nl.float32, buffer=nl.sbuf)
    kept = nl.ndarray((P, a, 1), nl.float32, buffer=nl.sbuf)
    both = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=last1, op=nl.add, data=t, axis=1)  # nki-library: axis=1 on 3-D = the last dim
    nisa.tensor_reduce(dst=last2, op=nl.maximum, data=t, axis=2)  # axis=2 on 3-D: the last dim too
    nisa.tensor_reduce(dst=kept, op=nl.add, data=t, axis=2, keepdims=True)
    nisa.tensor_reduce(dst=both, op=nl.add, data=t, axis=[1, 2])
    return store(last1), store(last2), store(kept), store(both)


@pytest.mark.parametrize("target", V3)
def test_tensor_reduce_3d_reduces_the_last_dims(target):
    x = ints_as_f32((P, 6, 40), -100, 100, 71)
    last1, last2, kept, both = run(k_tensor_reduce_3d, target, x)
    assert np.array_equal(last1, x.sum(axis=2))
    assert np.array_equal(last2, x.max(axis=2))
    assert np.array_equal(kept, x.sum(axis=2, keepdims=True))
    assert np.array_equal(both[:, 0], x.sum(axis=(1, 2)))


def k_tensor_reduce_bitwise(x):
    t = load(x)
    res = nl.ndarray((P, 3), nl.uint32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=res[:, 0:1], op=nl.bitwise_or, data=t, axis=1)
    nisa.tensor_reduce(dst=res[:, 1:2], op=nl.bitwise_and, data=t, axis=1)
    nisa.tensor_reduce(dst=res[:, 2:3], op=nl.bitwise_xor, data=t, axis=1)
    return store(res)


@pytest.mark.parametrize("target", V2)
def test_tensor_reduce_bitwise_uint32(target):
    x = rng(72).integers(0, 2**32, size=(P, 24), dtype=np.uint32)
    got = run(k_tensor_reduce_bitwise, target, x)
    assert np.array_equal(got[:, 0], np.bitwise_or.reduce(x, axis=1))
    assert np.array_equal(got[:, 1], np.bitwise_and.reduce(x, axis=1))
    assert np.array_equal(got[:, 2], np.bitwise_xor.reduce(x, axis=1))


def k_tensor_reduce_psum(x):
    ps = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
    nisa.tensor_copy(dst=ps, src=load(x))
    r = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=ps, axis=1)
    return store(r)


@pytest.mark.parametrize("target", V3)
def test_tensor_reduce_reads_psum(target):
    x = ints_as_f32((P, 512), -10, 10, 73)
    assert np.array_equal(run(k_tensor_reduce_psum, target, x)[:, 0], x.sum(axis=1))


def k_partition_reduce(x, op):
    t = load(x)
    r = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=r, op=op, data=t)
    return store(r)


@pytest.mark.parametrize("target", V2)
def test_tensor_partition_reduce(target):
    x = ints_as_f32((P, 64), -100, 100, 74)
    assert np.array_equal(run(k_partition_reduce, target, x, nl.add)[0], x.sum(axis=0))
    assert np.array_equal(run(k_partition_reduce, target, x, nl.maximum)[0], x.max(axis=0))


@pytest.mark.parametrize("target", V2)
def test_tensor_partition_reduce_bitwise(target):
    u = rng(75).integers(0, 2**32, size=(P, 16), dtype=np.uint32)
    assert np.array_equal(run(k_partition_reduce, target, u, nl.bitwise_or)[0], np.bitwise_or.reduce(u, axis=0))
    assert np.array_equal(run(k_partition_reduce, target, u, nl.bitwise_and)[0],
                          np.bitwise_and.reduce(u, axis=0))


# ================================================================ copies, casts, fills
def k_tensor_copy_engines(x):
    t = load(x)
    out = nl.ndarray((P, 3, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[:, 0, :], src=t, engine=nisa.engine.vector)
    nisa.tensor_copy(out[:, 1, :], t, engine=nisa.engine.gpsimd)
    nisa.tensor_copy(dst=out[:, 2, :], src=t, engine=nisa.scalar_engine)
    return store(out)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32, np.float16])
def test_tensor_copy_same_dtype_is_bit_exact_on_each_engine(target, dtype):
    if dtype in (np.int32, np.uint32):
        info = np.iinfo(dtype)
        x = rng(80).integers(info.min, info.max, size=(P, 64), dtype=dtype, endpoint=True)
    else:
        x = normal((P, 64), 80).astype(dtype)
        x[0, :3] = [np.nan, np.inf, -0.0]
    got = run(k_tensor_copy_engines, target, x)
    for i in range(3):
        assert np.array_equal(got[:, i].view(np.uint8), x.view(np.uint8)), i


def k_cast(x, dtype, engine):
    t = load(x)
    r = nl.ndarray(x.shape, dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=t, engine=engine)
    return store(r)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("engine", [nisa.engine.vector, nisa.engine.scalar, nisa.engine.gpsimd])
def test_tensor_copy_float_to_int32_rounds_to_nearest(target, engine):
    x = (rng(81).integers(-1000, 1000, size=(P, 64)) + rng(82).choice([0.2, 0.4, 0.6, 0.8, 0.0],
                                                                     size=(P, 64))).astype(np.float32)
    got = run(k_cast, target, x, nl.int32, engine)
    assert np.array_equal(got, np.rint(x).astype(np.int32))


@pytest.mark.parametrize("target", V3)
def test_tensor_copy_float_to_uint32_and_back(target):
    x = (rng(83).integers(0, 5000, size=(P, 64)) + 0.3).astype(np.float32)
    got = run(k_cast, target, x, nl.uint32, None)
    assert got.dtype == np.uint32 and np.array_equal(got, np.rint(x).astype(np.uint32))
    i = rng(84).integers(-2**24, 2**24, size=(P, 64)).astype(np.int32)
    assert np.array_equal(run(k_cast, target, i, nl.float32, None), i.astype(np.float32))


@pytest.mark.parametrize("target", V3)
def test_tensor_copy_to_bf16_and_fp16_rounds_to_nearest_even(target):
    x = normal((P, 128), 85, 10.0)
    b = run(k_cast, target, x, nl.bfloat16, None)
    assert np.array_equal(nki.to_float32(b), bf16_round(x))
    h = run(k_cast, target, x, nl.float16, nisa.engine.scalar)
    assert h.dtype == np.float16 and np.array_equal(h, x.astype(np.float16))


def k_copy_predicated(x, y, pred, reverse):
    a, b, p = load(x), load(y), load(pred)
    nisa.tensor_copy_predicated(dst=a, src=b, predicate=p, reverse_pred=reverse)
    return store(a)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("pdtype", [np.uint8, np.uint16, np.uint32])
def test_tensor_copy_predicated(target, reverse, pdtype):
    x, y = normal((P, 64), 86), normal((P, 64), 87)
    pred = rng(88).integers(0, 3, size=(P, 64)).astype(pdtype)  # 0, 1 and 2 (non-zero is true)
    got = run(k_copy_predicated, target, x, y, pred, reverse)
    keep = (pred == 0) if reverse else (pred != 0)
    assert np.array_equal(got, np.where(keep, y, x))


def k_memset(x):
    f = nl.ndarray((P, 2, 16), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=f[:, 0, :], value=1.5)
    nisa.memset(f[:, 1, :], -np.inf, engine=nisa.engine.gpsimd)
    i = nl.ndarray((P, 16), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=i, value=-7, engine=nisa.engine.vector)
    u = nl.ndarray((P, 4, 2, 8), nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=u, value=200)
    b = nl.ndarray((P, 16), nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=b, value=nl.fp32.min, engine=nisa.gpsimd_engine)
    ps = nl.ndarray((P, 16), nl.float32, buffer=nl.psum)
    nisa.memset(dst=ps, value=0.0)
    return store(f), store(i), store(u), store(b), evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_memset_values_dtypes_engines(target):
    f, i, u, b, ps = run(k_memset, target, np.zeros((1, 1), np.float32))
    assert np.all(f[:, 0] == 1.5) and np.all(f[:, 1] == -np.inf)
    assert i.dtype == np.int32 and np.all(i == -7)
    assert u.dtype == np.uint8 and u.shape == (P, 4, 2, 8) and np.all(u == 200)
    assert np.all(nki.to_float32(b) == bf16_round(np.float32(nl.fp32.min)))  # rounds to -inf in bf16
    assert np.all(ps == 0.0)


# ================================================================ GpSimd patterns
def k_iota(x):
    n = x.shape[1]
    a = nl.ndarray((P, n), nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=a, pattern=[[1, n]], offset=0)
    b = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
    nisa.iota(b, pattern=[[2, n]], offset=-5, channel_multiplier=n)
    c = nl.ndarray((P, n), nl.uint32, buffer=nl.sbuf)
    nisa.iota(dst=c, pattern=[[0, n]], offset=3, channel_multiplier=7)  # a per-partition constant
    d = nl.ndarray((P, 1, 4, n // 4), nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=d, pattern=[[0, 1], [n // 4, 4], [1, n // 4]], offset=10, channel_multiplier=-1)
    e = nl.ndarray((P, n), nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=e.ap([[n, P], [1, n], [1, 1], [1, 1]]), pattern=[[1, n]], offset=0, channel_multiplier=1,
              name="iota_ap")
    return store(a), store(b), store(c), store(d), store(e)


@pytest.mark.parametrize("target", V2)
def test_iota_patterns(target):
    n = 32
    a, b, c, d, e = run(k_iota, target, np.zeros((1, n), np.float32))
    p, f = np.meshgrid(np.arange(P), np.arange(n), indexing="ij")
    assert a.dtype == np.int32 and np.array_equal(a, f)
    assert np.array_equal(b, (-5 + 2 * f + n * p).astype(np.float32))
    assert c.dtype == np.uint32 and np.array_equal(c, (3 + 7 * p).astype(np.uint32))
    assert np.array_equal(d.reshape(P, n), 10 - p + f)
    assert np.array_equal(e, p + f)


def k_affine_select(x):
    t = load(x)
    r, c = x.shape
    causal = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    # keep key j <= query p: p - j >= 0
    nisa.affine_select(dst=causal, pattern=[[-1, c]], offset=0, channel_multiplier=1,
                       on_true_tile=t, on_false_value=-np.inf, cmp_op=nl.greater_equal)
    ident = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    ones = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    nisa.affine_select(ident, [[1, c]], 0, -1, ones, 0.0, cmp_op=nl.equal)  # j - p == 0
    shifted = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=shifted, pattern=[[-1, c]], offset=8, channel_multiplier=1, on_true_tile=t,
                       on_false_value=0.5, cmp_op=nl.greater)  # p + 8 - j > 0
    ne = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.affine_select(dst=ne, pattern=[[1, c]], offset=-3, channel_multiplier=0, on_true_tile=t,
                       on_false_value=2.0, cmp_op=nl.not_equal)  # j != 3, cast to bf16 through fp32
    return store(causal), store(ident), store(shifted), store(ne)


@pytest.mark.parametrize("target", V2)
def test_affine_select_masks(target):
    x = normal((P, 64), 90)
    causal, ident, shifted, ne = run(k_affine_select, target, x)
    p, j = np.meshgrid(np.arange(P), np.arange(64), indexing="ij")
    assert np.array_equal(causal, np.where(p - j >= 0, x, -np.inf))
    assert np.array_equal(ident, (p == j).astype(np.float32))
    assert np.array_equal(shifted, np.where(p + 8 - j > 0, x, np.float32(0.5)))
    assert np.array_equal(nki.to_float32(ne), bf16_round(np.where(j != 3, x, np.float32(2.0))))


def k_iota_repeat(x):
    n = x.shape[1]
    d = nl.ndarray((P, 1, 2, n // 2), nl.int32, buffer=nl.sbuf)
    # nki-library style: [[0, 1], [0, rc], [s, n]] repeats one row of s * i (a zero middle step)
    nisa.iota(dst=d, pattern=[[0, 1], [0, 2], [3, n // 2]], offset=1, channel_multiplier=0)
    return store(d)


@pytest.mark.parametrize("target", V3)
def test_iota_zero_step_repeat(target):
    n = 16
    d = run(k_iota_repeat, target, np.zeros((1, n), np.float32))
    want = np.broadcast_to(1 + 3 * np.arange(n // 2), (P, 1, 2, n // 2))
    assert np.array_equal(d, want)


# ================================================================ Scalar engine
def _sig(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    return torch.erf(torch.from_numpy(np.asarray(x, np.float64))).numpy()


# (op, float64 reference, input range); the table of NKI's activation functions.
ACTIVATIONS = [
    ("copy", lambda x: x, (-3, 3)), ("square", lambda x: x * x, (-3, 3)),
    ("relu", lambda x: np.maximum(x, 0), (-3, 3)), ("exp", np.exp, (-3, 3)), ("log", np.log, (0.1, 10)),
    ("tanh", np.tanh, (-3, 3)), ("sigmoid", _sig, (-3, 3)), ("sin", np.sin, (-3.1, 3.1)),
    ("arctan", np.arctan, (-1.5, 1.5)), ("sqrt", np.sqrt, (0.1, 10)), ("rsqrt", lambda x: 1 / np.sqrt(x), (0.1, 10)),
    ("reciprocal", lambda x: 1 / x, (0.5, 4)), ("sign", np.sign, (-3, 3)), ("abs", np.abs, (-3, 3)),
    ("gelu", lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), (-3, 3)),
    ("gelu_dx", lambda x: 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi),
     (-3, 3)),
    ("gelu_apprx_tanh", lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
     (-3, 3)),
    ("gelu_apprx_sigmoid", lambda x: x * _sig(1.702 * x), (-3, 3)),
    ("gelu_apprx_sigmoid_dx", lambda x: _sig(1.702 * x) * (1 + 1.702 * x * _sig(-1.702 * x)), (-3, 3)),
    ("silu", lambda x: x * _sig(x), (-3, 3)), ("silu_dx", lambda x: _sig(x) * (1 + x * (1 - _sig(x))), (-3, 3)),
    ("softplus", lambda x: np.log1p(np.exp(x)), (-3, 3)),
    ("mish", lambda x: x * np.tanh(np.log1p(np.exp(x))), (-3, 3)),
    ("erf", _erf, (-3, 3)), ("erf_dx", lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x), (-3, 3)),
]
EXACT_ACTIVATIONS = {"copy", "square", "relu", "sign", "abs"}


def k_activation(x, op):
    t = load(x)
    r = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=r, op=op, data=t)
    return store(r)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("name,ref,span", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_functions(target, name, ref, span):
    x = rng(100).uniform(*span, size=(P, 64)).astype(np.float32)
    got = run(k_activation, target, x, getattr(nl, name))
    want = ref(x.astype(np.float64))
    if name in EXACT_ACTIVATIONS:  # one fp32 rounding (or none): bit-exact
        assert np.array_equal(got, want.astype(np.float32))
    else:  # piece-wise polynomial tables on hardware: a stated tolerance
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def k_activation_bias_scale(x, col_bias, col_scale):
    t, b, s = load(x), load(col_bias), load(col_scale)
    out = nl.ndarray((P, 5, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=out[:, 0, :], op=nl.copy, data=t, bias=b, scale=2.0)
    nisa.activation(out[:, 1, :], nl.copy, t, bias=0.25, scale=-1.0)  # scalar bias (v3+)
    nisa.activation(dst=out[:, 2, :], op=nl.copy, data=t, scale=s)  # [P, 1] scale
    nisa.activation(dst=out[:, 3, :], op=nl.copy, data=t, bias=b[:, 0], scale=s[:, 0])  # 1-D column views
    nisa.activation(dst=out[:, 4, :], op=nl.exp, data=t, bias=b, scale=s, name="exp_affine")
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_activation_bias_and_scale_scalar_or_column(target):
    x = normal((P, 64), 101)
    bias, scale = normal((P, 1), 102), rng(103).uniform(0.5, 1.5, size=(P, 1)).astype(np.float32)
    got = run(k_activation_bias_scale, target, x, bias, scale)
    f = np.float32
    assert np.array_equal(got[:, 0], x * f(2) + bias)
    assert np.array_equal(got[:, 1], x * f(-1) + f(0.25))
    assert np.array_equal(got[:, 2], x * scale)
    assert np.array_equal(got[:, 3], x * scale + bias)
    np.testing.assert_allclose(got[:, 4], np.exp(x.astype(np.float64) * scale + bias), rtol=2e-6)


def k_activation_bf16_io(x):
    t = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=r, op=nl.relu, data=t, scale=3.0)
    return store(r)


@pytest.mark.parametrize("target", V2)
def test_activation_bf16_in_bf16_out(target):
    x = normal((P, 64), 104)
    got = run(k_activation_bf16_io, target, x)
    assert np.array_equal(nki.to_float32(got), bf16_round(np.maximum(bf16_round(x) * np.float32(3), 0)))


def k_activation_psum_in(x):
    ps = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
    nisa.tensor_copy(dst=ps, src=load(x))
    r = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=r, op=nl.square, data=ps)
    return store(r)


@pytest.mark.parametrize("target", V2)
def test_activation_reads_psum(target):
    x = normal((P, 64), 105)
    assert np.array_equal(run(k_activation_psum_in, target, x), x * x)


def k_activation_reduce_cmds(x):
    """The Scalar engine's reduce registers across instructions."""
    t = load(x)
    n = x.shape[1] // 4
    junk = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 4), nl.float32, buffer=nl.sbuf)
    q = [t[:, i * n:(i + 1) * n] for i in range(4)]
    # regs = 0 + sum(q0); idle leaves them; regs += sum(q2): read out
    nisa.activation(dst=junk, op=nl.copy, data=q[0], reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=junk, op=nl.copy, data=q[1], reduce_cmd=nisa.reduce_cmd.idle)
    nisa.activation(dst=junk, op=nl.copy, data=q[2], reduce_op=nl.add, reduce_res=res[:, 0:1],
                    reduce_cmd=nisa.reduce_cmd.reduce)
    # reset: regs = 0 (this instruction adds nothing); then regs += sum(q3)
    nisa.activation(dst=junk, op=nl.copy, data=q[1], reduce_cmd=nisa.reduce_cmd.reset)
    nisa.activation(dst=junk, op=nl.copy, data=q[3], reduce_op=nl.add, reduce_res=res[:, 1:2],
                    reduce_cmd=nisa.reduce_cmd.reduce)
    # reset_reduce with reduce_res: this instruction's own sum
    nisa.activation(dst=junk, op=nl.square, data=q[1], reduce_op=nl.add, reduce_res=res[:, 2:3],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    return store(res[:, 0:3])


@pytest.mark.parametrize("target", V3)
def test_activation_reduce_cmd_sequence(target):
    x = ints_as_f32((P, 64), -20, 20, 106)
    q = np.split(x, 4, axis=1)
    got = run(k_activation_reduce_cmds, target, x)
    assert np.array_equal(got[:, 0], q[0].sum(1) + q[2].sum(1))
    assert np.array_equal(got[:, 1], q[3].sum(1))
    assert np.array_equal(got[:, 2], (q[1] ** 2).sum(1))


def k_activation_reset_reduce_then_reduce(x):
    t = load(x)
    n = x.shape[1] // 2
    junk = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 2), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=junk, op=nl.copy, data=t[:, n:], reduce_op=nl.add,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)  # leaves sum(B) in the registers
    nisa.activation(dst=junk, op=nl.copy, data=t[:, :n], reduce_op=nl.add, reduce_res=res[:, 0:1],
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)  # regs = sum(A), read out
    nisa.activation(dst=junk, op=nl.copy, data=t[:, n:], reduce_op=nl.add, reduce_res=res[:, 1:2],
                    reduce_cmd=nisa.reduce_cmd.reduce)  # regs = sum(A) + sum(B)
    return store(res)


@pytest.mark.parametrize("target", V3)
def test_activation_reset_reduce_with_reduce_res_sets_the_registers(target):
    x = ints_as_f32((P, 64), -20, 20, 116)
    a, b = x[:, :32].sum(1), x[:, 32:].sum(1)
    got = run(k_activation_reset_reduce_then_reduce, target, x)
    assert np.array_equal(got[:, 0], a)
    assert np.array_equal(got[:, 1], a + b)


def k_activation_reduce(x, col):
    t, b = load(x), load(col)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 3), nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=d, op=nl.square, data=t, reduce_op=nl.add, reduce_res=res[:, 0:1])
    d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=d2, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=res[:, 1], bias=b,
                           scale=2.0)
    d3 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(d3, nl.exp, t, nl.add, res[:, 2:3], scale=0.5)
    return store(d), store(d2), store(res)


@pytest.mark.parametrize("target", V3)
def test_activation_reduce(target):
    x, col = ints_as_f32((P, 128), -8, 8, 107), ints_as_f32((P, 1), -4, 4, 108)
    d, d2, res = run(k_activation_reduce, target, x, col)
    assert np.array_equal(d, x * x) and np.array_equal(res[:, 0], (x * x).sum(1))
    assert np.array_equal(d2, 2 * x + col) and np.array_equal(res[:, 1], (2 * x + col).sum(1))
    np.testing.assert_allclose(res[:, 2], np.exp(0.5 * x.astype(np.float64)).sum(1), rtol=1e-5)


def k_reciprocal(x):
    t = load(x)
    r = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=r, data=t)
    nisa.reciprocal(t, t)  # in place, positional
    return store(r), store(t)


@pytest.mark.parametrize("target", V2)
def test_reciprocal(target):
    x = rng(109).uniform(0.25, 8, size=(P, 64)).astype(np.float32) * rng(110).choice([-1, 1], size=(P, 64))
    r, t = run(k_reciprocal, target, x)
    np.testing.assert_allclose(r, 1 / x.astype(np.float64), rtol=1e-6)
    assert np.array_equal(r, t)


def k_exponential(x, col):
    t, m = load(x), load(col)
    out = nl.ndarray((P, 3, x.shape[1]), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=out[:, 0, :], src=t)
    nisa.exponential(dst=out[:, 1, :], src=t, max_value=1.5)
    nisa.exponential(dst=out[:, 2, :], src=t, max_value=m, reduce_res=res[:, 0:1],
                     reduce_cmd=nisa.reduce_cmd.reset_reduce)
    return store(out), store(res)


def test_exponential_trn3():
    x, col = normal((P, 64), 111), normal((P, 1), 112)
    out, res = run(k_exponential, "trn3", x, col)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out[:, 0], np.exp(x64), rtol=2e-6)
    np.testing.assert_allclose(out[:, 1], np.exp(x64 - 1.5), rtol=2e-6)
    np.testing.assert_allclose(out[:, 2], np.exp(x64 - col), rtol=2e-6)
    np.testing.assert_allclose(res[:, 0], np.exp(x64 - col).sum(1), rtol=1e-5)


def test_exponential_is_trn3_only():
    with pytest.raises(nki.TernError, match="NeuronCore-v4"):
        run(k_exponential, "trn2", normal((P, 8), 113), normal((P, 1), 114))


def k_bn(x):
    t = load(x)
    n = x.shape[1]
    stats = nl.ndarray((P, 2, 6), nl.float32, buffer=nl.sbuf)
    nisa.bn_stats(dst=stats[:, 0, :], data=t[:, 0:n // 2])
    nisa.bn_stats(dst=stats[:, 1, :], data=t[:, n // 2:n])
    mv = nl.ndarray((P, 2), nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mv, data=stats)
    return store(stats), store(mv)


@pytest.mark.parametrize("target", V2)
def test_bn_stats_and_bn_aggr(target):
    x = normal((P, 512), 115, 3.0) + np.float32(1.0)
    stats, mv = run(k_bn, target, x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mv[:, 0], x64.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv[:, 1], x64.var(1), rtol=1e-5)
    half = x64[:, :256]
    even, odd = half[:, 0::2], half[:, 1::2]
    np.testing.assert_allclose(stats[:, 0, 0], 128)
    np.testing.assert_allclose(stats[:, 0, 1], even.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[:, 0, 2], even.var(1) * 128, rtol=1e-5)
    np.testing.assert_allclose(stats[:, 0, 4], odd.mean(1), rtol=1e-5, atol=1e-6)


# ================================================================ selection, search, scan
def distinct_rows(shape, seed):
    """Each partition a permutation of distinct float32 values (no ties)."""
    g = rng(seed)
    return np.stack([g.permutation(shape[1]) for _ in range(shape[0])]).astype(np.float32) * np.float32(0.5) - 7


def k_max8_find_index8(x):
    t = load(x)
    top = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    idx = nl.ndarray((P, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx, data=t, vals=top)
    idx16 = nl.ndarray((P, 8), nl.uint16, buffer=nl.sbuf)
    nisa.nc_find_index8(idx16, t, top)
    idx_f = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idx_f, src=idx)  # the nki-library idiom: uint32 indices -> fp32
    return store(top), store(idx), store(idx16), store(idx_f)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("n", [8, 100, 512])
def test_max8_and_nc_find_index8(target, n):
    x = distinct_rows((P, n), 120 + n)
    top, idx, idx16, idx_f = run(k_max8_find_index8, target, x)
    order = np.argsort(-x, axis=1, kind="stable")[:, :8]
    assert np.array_equal(top, np.take_along_axis(x, order, 1))
    assert idx.dtype == np.uint32 and np.array_equal(idx, order)
    assert idx16.dtype == np.uint16 and np.array_equal(idx16, order)
    assert np.array_equal(idx_f, order.astype(np.float32))


def k_max8_3d(x):
    t = load(x)
    top = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t[:, 1, :])  # a 3-D tile indexed by an int middle index
    all8 = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=all8, src=t)  # free dims flattened
    return store(top), store(all8)


@pytest.mark.parametrize("target", V3)
def test_max8_on_3d_data(target):
    x = distinct_rows((P, 96), 130).reshape(P, 3, 32)
    top, all8 = run(k_max8_3d, target, x)
    assert np.array_equal(top, -np.sort(-x[:, 1, :], axis=1)[:, :8])
    assert np.array_equal(all8, -np.sort(-x.reshape(P, -1), axis=1)[:, :8])


def k_match_replace8(x):
    t = load(x)
    top = nl.ndarray((P, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((P, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=out, data=t, vals=top, imm=float("-inf"), dst_idx=idx)
    out2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=out2, data=t, vals=top, imm=-1000.0)  # without dst_idx
    return store(top), store(out), store(idx), store(out2)


def match_replace_ref(x, vals, imm):
    data, idx = x.copy(), np.zeros(vals.shape, np.uint32)
    for p in range(x.shape[0]):
        for j in range(vals.shape[1]):
            hits = np.nonzero(data[p] == vals[p, j])[0]
            if len(hits):
                idx[p, j] = hits[0]
                data[p, hits[0]] = imm
    return data, idx


@pytest.mark.parametrize("target", V3)
def test_nc_match_replace8_with_ties(target):
    # few distinct values: the top 8 repeat, and each repeat finds the next occurrence
    x = rng(131).integers(0, 6, size=(P, 64)).astype(np.float32)
    top, out, idx, out2 = run(k_match_replace8, target, x)
    assert np.array_equal(top, -np.sort(-x, axis=1)[:, :8])
    want, want_idx = match_replace_ref(x, top, -np.inf)
    assert np.array_equal(out, want) and np.array_equal(idx, want_idx)
    assert len(set(idx[0].tolist())) == 8  # distinct indices for tied values
    assert np.array_equal(out2, match_replace_ref(x, top, -1000.0)[0])


def k_topk16(x):
    """Iterative top-16: max8, match_replace8 in place, max8 again (the
    nki-library argsort pattern), indices into column views via dst_idx."""
    t = load(x)
    vals = nl.ndarray((P, 16), nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((P, 16), nl.uint32, buffer=nl.sbuf)
    for r in nl.sequential_range(2):
        nisa.max8(dst=vals[:, nl.ds(r * 8, 8)], src=t)
        nisa.nc_match_replace8(dst=t, data=t, vals=vals[:, nl.ds(r * 8, 8)], imm=nl.fp32.min,
                               dst_idx=idx[:, nl.ds(r * 8, 8)])
    return store(vals), store(idx)


@pytest.mark.parametrize("target", V3)
def test_iterative_topk_with_match_replace8(target):
    x = distinct_rows((P, 200), 132)
    vals, idx = run(k_topk16, target, x)
    order = np.argsort(-x, axis=1)[:, :16]
    assert np.array_equal(idx, order) and np.array_equal(vals, np.take_along_axis(x, order, 1))


def k_scan(d0, d1, col, op0, op1, initial_is_col, reverse0, reverse1):
    a, b, c = load(d0), load(d1), load(col)
    r = nl.ndarray(d0.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=r, data0=a, data1=b, initial=c if initial_is_col else 2.0, op0=op0, op1=op1,
                            reverse0=reverse0, reverse1=reverse1)
    return store(r)


def scan_ref(d0, d1, init, f0, f1, reverse0, reverse1):
    out = np.zeros_like(d0)
    state = np.broadcast_to(np.asarray(init, np.float32).reshape(-1), (d0.shape[0],)).astype(np.float32)
    for i in range(d0.shape[1]):
        t = f0(state, d0[:, i]) if reverse0 else f0(d0[:, i], state)
        state = f1(d1[:, i], t) if reverse1 else f1(t, d1[:, i])
        out[:, i] = state
    return out


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("col", [False, True], ids=["scalar_init", "column_init"])
def test_tensor_tensor_scan_cumulative(target, col):
    """r[i] = d0[i] * r[i-1] + d1[i] (the cumsum kernel's recurrence), exact on small integers."""
    d0 = rng(140).integers(0, 2, size=(P, 64)).astype(np.float32)
    d1 = ints_as_f32((P, 64), -5, 5, 141)
    init = ints_as_f32((P, 1), -3, 3, 142)
    got = run(k_scan, target, d0, d1, init, nl.multiply, nl.add, col, False, False)
    want = scan_ref(d0, d1, init[:, 0] if col else 2.0, np.multiply, np.add, False, False)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("reverse0,reverse1", [(False, False), (True, False), (False, True), (True, True)])
def test_tensor_tensor_scan_reverse_operands(target, reverse0, reverse1):
    d0, d1 = ints_as_f32((P, 32), -4, 4, 143), ints_as_f32((P, 32), -4, 4, 144)
    init = ints_as_f32((P, 1), -3, 3, 145)
    got = run(k_scan, target, d0, d1, init, nl.subtract, nl.subtract, True, reverse0, reverse1)
    want = scan_ref(d0, d1, init[:, 0], np.subtract, np.subtract, reverse0, reverse1)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("target", V3)
def test_tensor_tensor_scan_max_add(target):
    d0, d1 = ints_as_f32((P, 48), -9, 9, 146), ints_as_f32((P, 48), -9, 9, 147)
    got = run(k_scan, target, d0, d1, np.zeros((P, 1), np.float32), nl.maximum, nl.add, False, False, False)
    assert np.array_equal(got, scan_ref(d0, d1, 2.0, np.maximum, np.add, False, False))


def k_select_reduce(x, pred, col, reverse):
    t, p, c = load(x), load(pred), load(col)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=-5.0, reduce_res=res,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum, reverse_pred=reverse)
    d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d2, predicate=p, on_true=t, on_false=c, reverse_pred=reverse)  # column on_false
    return store(d), store(res), store(d2)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("reverse", [False, True])
def test_select_reduce(target, reverse):
    x, col = normal((P, 64), 150), normal((P, 1), 151)
    pred = rng(152).integers(0, 2, size=(P, 64)).astype(np.uint8)
    d, res, d2 = run(k_select_reduce, target, x, pred, col, reverse)
    keep = (pred == 0) if reverse else (pred != 0)
    want = np.where(keep, x, np.float32(-5))
    assert np.array_equal(d, want) and np.array_equal(res[:, 0], want.max(1))
    assert np.array_equal(d2, np.where(keep, x, col))


def k_range_select(x, lo, hi, lo2, hi2):
    t, b0, b1, c0, c1 = load(x), load(lo), load(hi), load(lo2), load(hi2)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=d, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                      reduce_op=nl.maximum, reduce_res=res, range_start=0)
    d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=d2, on_true_tile=t, comp_op0=nl.greater, comp_op1=nl.less_equal, bound0=c0[:, 0],
                      bound1=c1[:, 0], range_start=100.0)
    return store(d), store(res), store(d2)


@pytest.mark.parametrize("target", V3)
def test_range_select(target):
    n = 64
    x = normal((P, n), 153)
    lo = rng(154).integers(0, 32, size=(P, 1)).astype(np.float32)
    hi = lo + rng(155).integers(1, 32, size=(P, 1)).astype(np.float32)
    d, res, d2 = run(k_range_select, target, x, lo, hi, lo + 100, hi + 100)
    i = np.arange(n, dtype=np.float32)[None, :]
    fmin = np.float32(-3.4028235e38)
    want = np.where((i >= lo) & (i < hi), x, fmin)
    assert np.array_equal(d, want) and np.array_equal(res[:, 0], want.max(1))
    j = i + 100  # range_start offsets the compared index
    assert np.array_equal(d2, np.where((j > lo + 100) & (j <= hi + 100), x, fmin))


def k_nonzero(x):
    t = load(x)
    d = nl.ndarray((P, x.shape[1] + 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=d, value=-99)
    nisa.nonzero_with_count(dst=d, src=t, index_offset=16, padding_val=-1)
    return store(d)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_nonzero_with_count(target, dtype):
    n = 24
    x = (rng(156).random((P, n)) < 0.3).astype(dtype) * rng(157).integers(1, 5, size=(P, n)).astype(dtype)
    x[0] = [0, 1, 1, 0, 0, 1, 0, 0] * 3
    got = run(k_nonzero, target, x)
    for p in range(P):
        if p % 16:
            assert np.all(got[p] == -99), p  # only partitions 0, 16, ... are written
            continue
        nz = np.nonzero(x[p])[0] + 16
        want = np.full(n + 1, -1, np.int32)
        want[:len(nz)] = nz
        want[n] = len(nz)
        assert np.array_equal(got[p], want), p


def k_n_gather(x, ind):
    t, i = load(x), load(ind)
    d = nl.ndarray(ind.shape, x.dtype, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=d, data=t, indices=i)
    return store(d)


@pytest.mark.parametrize("target", V2)
def test_nc_n_gather(target):
    x = normal((P, 4, 200), 158)
    ind = rng(159).integers(0, 800, size=(P, 40)).astype(np.uint32)
    got = run(k_n_gather, target, x, ind)
    assert np.array_equal(got, np.take_along_axis(x.reshape(P, -1), ind.astype(np.int64), 1))


def k_stream_shuffle(x, mask):
    t = load(x)
    d = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=d, value=-1.0)
    nisa.nc_stream_shuffle(dst=d, src=t, shuffle_mask=mask)
    b = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.nc_stream_shuffle(src=t, dst=b, shuffle_mask=[0] * 32)  # broadcast each quadrant's first partition
    s = load(x)
    nisa.nc_stream_shuffle(dst=s[0:32, :], src=s[0:32, :], shuffle_mask=[16] + [255] * 31)  # in place
    return store(d), store(b), store(s)


@pytest.mark.parametrize("target", V2)
def test_nc_stream_shuffle(target):
    x = normal((P, 16), 160)
    mask = [int(v) for v in rng(161).permutation(32)]
    for i in (3, 10, 31):
        mask[i] = 255  # keep dst partition i
    d, b, s = run(k_stream_shuffle, target, x, mask)
    for q in range(4):
        for i in range(32):
            p = q * 32 + i
            assert np.array_equal(d[p], np.full(16, -1, np.float32) if mask[i] == 255 else x[q * 32 + mask[i]])
            assert np.array_equal(b[p], x[q * 32])
    assert np.array_equal(s[0], x[16]) and np.array_equal(s[1:], x[1:])


def k_local_gather(src, index, n_elem):
    t, i = load(src), load(index)
    n_idx = index.shape[1] * 16
    d = nl.ndarray((P, n_idx * n_elem), src.dtype, buffer=nl.sbuf)
    nisa.local_gather(dst=d, src_buffer=t, index=i, num_elem_per_idx=n_elem)
    return store(d)


def local_gather_ref(src, index, n_elem):
    out = []
    for core in range(8):
        rows = slice(16 * core, 16 * core + 16)
        idx = index[rows].flatten(order="F").astype(np.int64)
        blocks = src[rows].reshape(16, -1, n_elem)
        out.append(blocks[:, idx, :].reshape(16, -1))
    return np.concatenate(out)


@pytest.mark.parametrize("target", V2)
@pytest.mark.parametrize("n_elem", [1, 4])
def test_local_gather(target, n_elem):
    src = normal((P, 64 * n_elem), 162)
    index = rng(163).integers(0, 64, size=(P, 2)).astype(np.uint16)
    got = run(k_local_gather, target, src, index, n_elem)
    assert np.array_equal(got, local_gather_ref(src, index, n_elem))


@pytest.mark.parametrize("kernel,args", [
    (k_range_select, lambda: [np.zeros((P, 8), np.float32)] + [np.zeros((P, 1), np.float32)] * 4),
    (k_nonzero, lambda: [np.zeros((P, 8), np.float32)]),
], ids=["range_select", "nonzero_with_count"])
def test_v3_instructions_are_rejected_on_trn1(kernel, args):
    with pytest.raises(nki.TernError, match="NeuronCore-v3 or later"):
        run(kernel, "trn1", *args())


# ================================================================ MX (trn3)
def k_mx(lhsT, rhs):
    """quantize_mx both operands (groups of 8 partitions x 4 values), nc_matmul_mx."""
    M = lhsT.shape[1] // 4
    N = rhs.shape[1] // 4
    a_src, b_src = load(lhsT), load(rhs)
    a = nl.ndarray((P, M), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    a_scale = nl.ndarray((P // 8, M), nl.uint8, buffer=nl.sbuf)
    b = nl.ndarray((P, N), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    b_scale = nl.ndarray((P // 8, N), nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=a, src=a_src, dst_scale=a_scale)
    nisa.quantize_mx(dst=b, src=b_src, dst_scale=b_scale)
    ps = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=ps, stationary=a, moving=b, stationary_scale=a_scale, moving_scale=b_scale)
    return evacuate(ps)


def test_quantize_mx_and_nc_matmul_mx_trn3():
    """MXFP8 (E4M3, 32-element groups): within a few percent of the exact product (relative Frobenius
    error; E4M3's half-ulp is 2^-4), not exact, and in the documented layout (partition p, column
    4 m + j holds contraction row 4 p + j: the wrong layout is off by > 100 %)."""
    M, N = 32, 64
    a = bf16_round(rng(170).standard_normal((P, 4 * M)).astype(np.float32))
    b = bf16_round(rng(171).standard_normal((P, 4 * N)).astype(np.float32))
    got = run(k_mx, "trn3", torch.from_numpy(a).to(torch.bfloat16), torch.from_numpy(b).to(torch.bfloat16))
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    A = a.reshape(P, M, 4).transpose(0, 2, 1).reshape(4 * P, M)
    B = b.reshape(P, N, 4).transpose(0, 2, 1).reshape(4 * P, N)
    exact = A.T.astype(np.float64) @ B.astype(np.float64)
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert 0 < rel < 0.06


# ================================================================ enums and versions
def test_isa_enums_and_constants():
    from tern.nki.isa import constants
    assert [nisa.engine.tensor, nisa.engine.scalar, nisa.engine.gpsimd, nisa.engine.dma, nisa.engine.vector,
            nisa.engine.sync, nisa.engine.unknown] == [1, 2, 3, 4, 5, 6, 0]
    assert nisa.vector_engine == nisa.engine.vector and nisa.gpsimd_engine == nisa.engine.gpsimd
    assert nisa.scalar_engine == nisa.engine.scalar and nisa.tensor_engine == nisa.engine.tensor
    assert [int(c) for c in (nisa.reduce_cmd.idle, nisa.reduce_cmd.reset, nisa.reduce_cmd.reduce,
                             nisa.reduce_cmd.reset_reduce, nisa.reduce_cmd.load_reduce)] == [0, 1, 2, 3, 4]
    assert [int(m) for m in (nisa.dge_mode.unknown, nisa.dge_mode.swdge, nisa.dge_mode.hwdge,
                             nisa.dge_mode.none)] == [0, 1, 2, 3]
    assert int(nisa.oob_mode.error) == 0 and int(nisa.oob_mode.skip) == 1
    assert nisa.matmul_perf_mode.none.value == "none" and nisa.matmul_perf_mode.double_row.value == "double_row"
    assert constants.dge_mode.hwdge is nisa.dge_mode.hwdge and constants.oob_mode.skip is nisa.oob_mode.skip
    assert constants.matmul_perf_mode.double_row is nisa.matmul_perf_mode.double_row
    assert nisa.nc_version.gen2 < nisa.nc_version.gen3 < nisa.nc_version.gen4
    assert nisa.nc_version.gen3.name == "gen3" and nisa.nc_version["gen4"] is nisa.nc_version.gen4


def test_nki_isa_constants_import_paths():
    nki.install()
    from nki.isa import constants as nisa_constants
    from nki.isa import dge_mode, engine, oob_mode, reduce_cmd
    from nki.isa.constants import matmul_perf_mode
    from nki.language import NKIObject, affine_range, static_range
    assert nisa_constants.dge_mode.hwdge == dge_mode.hwdge == 2
    assert oob_mode.skip == 1 and reduce_cmd.reset_reduce == 3 and engine.gpsimd == 3
    assert matmul_perf_mode.double_row.value == "double_row"
    assert NKIObject is nl.NKIObject and list(affine_range(3)) == [0, 1, 2] and list(static_range(1, 3)) == [1, 2]


def k_version(x):
    v = nisa.get_nc_version()
    out = nl.ndarray((1, 4), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t[:, 0:1], value=float(int(v)))
    nisa.memset(dst=t[:, 1:2], value=1.0 if v <= nisa.nc_version.gen2 else 0.0)
    nisa.memset(dst=t[:, 2:3], value=1.0 if v >= nisa.nc_version.gen3 else 0.0)
    nisa.memset(dst=t[:, 3:4], value=1.0 if v >= nisa.nc_version.gen4 else 0.0)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target,gen", [("trn1", 2), ("trn2", 3), ("trn3", 4)])
def test_get_nc_version_orders_by_target(target, gen):
    got = run(k_version, target, np.zeros((1, 1), np.float32))[0]
    assert np.array_equal(got, [gen, gen <= 2, gen >= 3, gen >= 4])


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


# ================================================================ kernel arguments and results
@dataclasses.dataclass
class ScaleConfig(nl.NKIObject):
    scale: float = 2.0
    bias: float = 0.0
    tile_f: int = 32


class Dims(nl.NKIObject):
    """Undecorated NKIObject: annotated fields, keyword construction, __post_init__."""
    R: int
    F: int
    n_tiles: int

    def __post_init__(self):
        self.n_tiles = self.F // 16


def k_config(x, cfg: ScaleConfig, dims: Dims, flag=True):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(dims.n_tiles):
        t = nl.ndarray((dims.R, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, nl.ds(i * 16, 16)])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=cfg.scale, op1=nl.add,
                           operand1=cfg.bias if flag else 0.0)
        nisa.dma_copy(dst=out[:, nl.ds(i * 16, 16)], src=t)
    return out


@pytest.mark.parametrize("target", V2)
def test_nkiobject_arguments(target):
    x = normal((P, 48), 214)
    dims = Dims(R=P, F=48)
    assert dims.n_tiles == 3
    got = run(k_config, target, x, ScaleConfig(scale=3.0, bias=1.0), dims)
    assert np.array_equal(got, x * np.float32(3) + np.float32(1))
    got = run(k_config, target, x, cfg=ScaleConfig(), dims=dims, flag=False)
    assert np.array_equal(got, x * np.float32(2))


@nki.jit
def inner_double(x):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    t = load(x)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


def k_outer(x):
    y = inner_double(x)  # a @nki.jit kernel called from a kernel
    return inner_double(y)


@pytest.mark.parametrize("target", V2)
def test_nested_jit_call(target):
    x = normal((P, 16), 215)
    assert np.array_equal(run(k_outer, target, x), x * 4)


def k_keywords(a, b, *, alpha=1.0):
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    x, y = load(a), load(b)
    nisa.scalar_tensor_tensor(dst=x, data=x, op0=nl.multiply, operand0=alpha, op1=nl.subtract, operand1=y)
    nisa.dma_copy(dst=out, src=x)
    return out


@pytest.mark.parametrize("target", V2)
def test_keyword_array_arguments(target):
    a, b = normal((P, 16), 216), normal((P, 16), 217)
    assert np.array_equal(run(k_keywords, target, b=b, a=a, alpha=2.0), a * np.float32(2) - b)


def k_write_into(x, out):
    """An output passed in and written in place (rmsnorm_tkg style), also returned."""
    t = load(x)
    nisa.activation(dst=t, op=nl.relu, data=t)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target", V2)
def test_output_argument_written_in_place_numpy(target):
    x = normal((P, 32), 218)
    out = np.zeros((P, 32), np.float32)
    got = run(k_write_into, target, x, out)
    assert np.array_equal(out, np.maximum(x, 0)) and np.array_equal(got, out)


@pytest.mark.parametrize("target", V3)
def test_output_argument_written_in_place_torch(target):
    x = torch.randn(P, 32, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(P, 32)
    got = run(k_write_into, target, x, out=out)
    assert torch.equal(out, torch.relu(x)) and isinstance(got, torch.Tensor) and torch.equal(got, out)
    xb = x.to(torch.bfloat16)
    ob = torch.zeros(P, 32, dtype=torch.bfloat16)
    run(k_write_into, target, xb, ob)
    assert torch.equal(ob, torch.relu(xb))


def k_write_only(x, out):
    t = load(x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=t)


@pytest.mark.parametrize("target", V2)
def test_output_argument_without_return(target):
    x = normal((P, 8), 219)
    out = np.zeros_like(x)
    assert run(k_write_only, target, x, out) is None
    assert np.array_equal(out, x + np.float32(1))


def k_returns_input(x):
    return x


def k_returns_tuple_and_list(x):
    a = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    b = nl.ndarray((P, 1), nl.float32, buffer=nl.shared_hbm)
    t = load(x)
    nisa.dma_copy(dst=a, src=t)
    s = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=t, axis=1)
    nisa.dma_copy(dst=b, src=s)
    return (a, [b, x])


@pytest.mark.parametrize("target", V2)
def test_returning_inputs_tuples_and_lists(target):
    x = ints_as_f32((P, 16), -9, 9, 220)
    same = run(k_returns_input, target, x)
    assert np.array_equal(same, x)
    a, rest = run(k_returns_tuple_and_list, target, x)
    assert isinstance(rest, list) and len(rest) == 2
    assert np.array_equal(a, x) and np.array_equal(rest[0][:, 0], x.sum(1)) and np.array_equal(rest[1], x)


def test_simulate_takes_torch_and_returns_torch():
    x = torch.arange(P * 8, dtype=torch.float32).reshape(P, 8)
    got = nki.simulate(k_returns_tuple_and_list, platform_target="trn2")(x)
    assert isinstance(got[0], torch.Tensor) and torch.equal(got[0], x)
    assert torch.equal(got[1][0][:, 0], x.sum(1))


# ================================================================ more argument forms
def k_exponential_accumulate(x):
    t = load(x)
    n = x.shape[1] // 2
    d = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 3), nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=d, src=t[:, :n], reduce_res=res[:, 0:1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.exponential(dst=d, src=t[:, n:], reduce_res=res[:, 1:2], reduce_cmd=nisa.reduce_cmd.reduce)
    nisa.exponential(dst=d, src=t[:, :n], reduce_res=res[:, 2:3], reduce_cmd=nisa.reduce_cmd.load_reduce,
                     reduce_init=5.0)
    return store(res)


def test_exponential_reduce_cmd_accumulates_trn3():
    x = normal((P, 64), 230)
    res = run(k_exponential_accumulate, "trn3", x)
    e = np.exp(x.astype(np.float64))
    a, b = e[:, :32].sum(1), e[:, 32:].sum(1)
    np.testing.assert_allclose(res[:, 0], a, rtol=1e-5)
    np.testing.assert_allclose(res[:, 1], a + b, rtol=1e-5)
    np.testing.assert_allclose(res[:, 2], 5.0 + a, rtol=1e-5)


def k_select_reduce_accumulate(x, pred):
    t, p = load(x), load(pred)
    n = x.shape[1] // 2
    d = nl.ndarray((P, n), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((P, 2), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p[:, :n], on_true=t[:, :n], on_false=-100.0, reduce_res=res[:, 0:1],
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.select_reduce(dst=d, predicate=p[:, n:], on_true=t[:, n:], on_false=-100.0, reduce_res=res[:, 1:2],
                       reduce_cmd=nisa.reduce_cmd.reduce)
    return store(res)


@pytest.mark.parametrize("target", V3)
def test_select_reduce_reduce_cmd_continues_the_max(target):
    x = normal((P, 64), 231)
    pred = rng(232).integers(0, 2, size=(P, 64)).astype(np.uint8)
    x[:, :32] += 10  # the first half holds the larger values
    res = run(k_select_reduce_accumulate, target, x, pred)
    sel = np.where(pred != 0, x, np.float32(-100))
    assert np.array_equal(res[:, 0], sel[:, :32].max(1))
    assert np.array_equal(res[:, 1], sel.max(1))


def fp8_codes(x, exp_bits, man_bits, bias, vmax):
    """float32 -> FP8 codes, round to nearest even, |x| <= vmax (from the format's definition)."""
    mags, codes = [], []
    for code in range(2 ** (exp_bits + man_bits)):
        e, m = code >> man_bits, code & ((1 << man_bits) - 1)
        v = (m / 2 ** man_bits) * 2.0 ** (1 - bias) if e == 0 else (1 + m / 2 ** man_bits) * 2.0 ** (e - bias)
        if v <= vmax:
            mags.append(v)
            codes.append(code)
    mags, codes = np.array(mags), np.array(codes)
    a = np.abs(x.astype(np.float64))
    i = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo, hi = mags[i - 1], mags[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (codes[i] % 2 == 0))
    c = np.where(up, codes[i], codes[i - 1])
    return (c | np.where(np.signbit(x), 1 << (exp_bits + man_bits), 0)).astype(np.uint8)


@pytest.mark.parametrize("target,dtype,fmt", [
    ("trn2", nl.float8_e4m3, (4, 3, 7, 240.0)), ("trn2", nl.float8_e5m2, (5, 2, 15, 57344.0)),
    ("trn3", nl.float8_e4m3fn, (4, 3, 7, 448.0)), ("trn3", nl.float8_e5m2, (5, 2, 15, 57344.0)),
])
def test_tensor_copy_fp32_to_fp8_rounds_to_nearest_even(target, dtype, fmt):
    x = normal((P, 64), 233, 20.0)
    x = np.clip(x, -fmt[3] * 0.9, fmt[3] * 0.9).astype(np.float32)
    got = run(k_cast, target, x, dtype, None)
    assert np.array_equal(np.asarray(got), fp8_codes(x, *fmt))


def k_dma_transpose_4d(x):
    """nki-library's 4-D access patterns: [[d, n], [1, 1], [1, 1], [1, d]] -> [[n, d], [1, 1], [1, 1], [1, n]]."""
    n, d = x.shape
    t = nl.ndarray((d, n), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t.ap([[n, d], [1, 1], [1, 1], [1, n]]), src=x.ap([[d, n], [1, 1], [1, 1], [1, d]]),
                       axes=(3, 1, 2, 0))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_transpose_4d_access_patterns(target):
    x = normal((16, 128), 234).astype(np.float16)
    assert np.array_equal(run(k_dma_transpose_4d, target, x), x.T)


def k_transpose_bf16_psum(x):
    t = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    ps = nl.ndarray((x.shape[1], x.shape[0]), nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=t)
    return evacuate(ps)


@pytest.mark.parametrize("target", V3)
def test_nc_transpose_bf16_into_bf16_psum(target):
    x = bf16_round(normal((64, 128), 235))
    got = run(k_transpose_bf16_psum, target, x)
    assert np.array_equal(nki.to_float32(got), x.T)


def k_matmul_3d_operands(lhsT, rhs):
    """Operands taken from 3-D tiles with an int middle index; dst a 3-D PSUM tile."""
    a, b = load(lhsT), load(rhs)  # (P, 2, M), (P, 2, N)
    M, N = lhsT.shape[2], rhs.shape[2]
    ps = nl.ndarray((M, 2, N), nl.float32, buffer=nl.psum)
    for j in nl.affine_range(2):
        nisa.nc_matmul(dst=ps[:, j, :], stationary=a[:, j, :], moving=b[:, j, :])
    return evacuate(ps)


@pytest.mark.parametrize("target", V2)
def test_nc_matmul_3d_tiles(target):
    a, b = ints_as_f32((P, 2, 32), seed=236), ints_as_f32((P, 2, 64), seed=237)
    got = run(k_matmul_3d_operands, target, a, b)
    for j in range(2):
        assert np.array_equal(got[:, j, :], a[:, j, :].T @ b[:, j, :])


def k_plain(x):
    return inner_double(x)


def test_jit_decorator_forms():
    x = normal((P, 8), 238)
    deco = nki.jit(platform_target="trn2")(k_plain)
    traced = nki.jit(mode="trace", platform_target="trn3")(k_plain)
    auto = nki.jit(k_plain, mode="auto")
    for k in (deco, traced, auto):
        assert np.array_equal(k(x), x * 2)


def k_gpsimd_reads_psum(x):
    ps = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
    nisa.memset(dst=ps, value=1.0)
    t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=ps, engine=nisa.engine.gpsimd)
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_gpsimd_cannot_access_psum(target):
    with pytest.raises(nki.TernError, match="(?i)psum"):
        run(k_gpsimd_reads_psum, target, np.zeros((P, 8), np.float32))


# ================================================================ shapes public kernels pass loosely
def k_dma_unaligned_partitions(x):
    t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:1, :], src=x[0:1, :])
    nisa.dma_copy(dst=t[1:P, :], src=x[1:P, :])  # a DMA into partitions 1..127
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_dma_copy_into_any_partition_range(target):
    x = normal((P, 16), 238)
    assert np.array_equal(run(k_dma_unaligned_partitions, target, x), x)


def k_unit_dim_view_operand(x):
    t = load(x)
    out = nl.ndarray((P, 1, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=out, op=nl.copy, data=t.expand_dim(1), scale=2.0)  # a size-1 dim of stride 0
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_activation_on_expand_dim_view(target):
    x = normal((P, 16), 239)
    assert np.array_equal(run(k_unit_dim_view_operand, target, x)[:, 0], x * np.float32(2))


def k_loose_shapes(x, col3, flat):
    """Unit-dim mismatches nki-library relies on: (P,) vs (P, 1), (n,) vs (1, n), 3-D (P, 1) operands."""
    t = load(x)  # (P, F)
    c3 = load(col3)  # (P, 3, 1)
    out = nl.ndarray((P, 4, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[:, 0, :], data=t, op0=nl.add, operand0=c3[:, 1, :])  # a (P, 1) from 3-D
    t3 = load(x.reshape((P, 1, x.shape[1])))
    nisa.activation(dst=out[:, 1:2, :], op=nl.copy, data=t3[:, 0:1, :], bias=c3[:, 2, :])  # 3-D dst/data
    s = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=t, axis=1)
    nisa.tensor_copy(dst=out[:, 2, 0], src=s)  # (P,) <- (P, 1)
    nisa.tensor_copy(dst=out[:, 2, 1:], src=t[:, 1:])
    col = nl.ndarray((x.shape[1], 1), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=flat[nl.ds(x.shape[1], x.shape[1])])  # (F, 1) <- (F,)
    nisa.dma_copy(dst=out[:, 3, :], src=x)
    nisa.dma_copy(dst=out[0:x.shape[1], 3, 0:1], src=col)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_loose_unit_dim_shapes(target):
    x, col3 = ints_as_f32((P, 16), -50, 50, 240), normal((P, 3, 1), 241)
    flat = normal((64,), 242)
    got = run(k_loose_shapes, target, x, col3, flat)
    assert np.array_equal(got[:, 0], x + col3[:, 1])
    assert np.array_equal(got[:, 1], x + col3[:, 2])
    assert np.array_equal(got[:, 2, 0], x.sum(1))
    assert np.array_equal(got[:, 2, 1:], x[:, 1:])
    assert np.array_equal(got[:16, 3, 0], flat[16:32])
    assert np.array_equal(got[:16, 3, 1:], x[:16, 1:]) and np.array_equal(got[16:, 3], x[16:])


def k_dma_1d_into_row(flat):
    row = nl.ndarray((1, 16), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=row, value=-1.0)
    nisa.dma_copy(dst=row, src=flat[nl.ds(16, 16)])  # (1, 16) <- (16,): the same 16 elements
    return store(row)


@pytest.mark.parametrize("target", V3)
def test_dma_copy_1d_source_into_a_row(target):
    flat = np.arange(64, dtype=np.float32)
    assert np.array_equal(run(k_dma_1d_into_row, target, flat)[0], flat[16:32])


def k_broadcast_operand(x, row):
    """tensor_tensor against a 0-stride broadcast of a (P, n) tile across a middle dim."""
    t = load(x)  # (P, 4, n)
    r = load(row)  # (P, n)
    n = row.shape[1]
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d, data1=t, data2=r.ap([[n, P], [0, 4], [1, n]]), op=nl.multiply)
    return store(d)


@pytest.mark.parametrize("target", V2)
def test_tensor_tensor_broadcast_ap_operand(target):
    x, row = normal((P, 4, 16), 243), normal((P, 16), 244)
    assert np.array_equal(run(k_broadcast_operand, target, x, row), x * row[:, None, :])


def k_find_index_broadcast_vals(x):
    """vals as a broadcast .ap of one (P, 1) column (8 equal values): every slot the first occurrence."""
    t = load(x)
    m = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m, op=nl.maximum, data=t, axis=1)
    idx = nl.ndarray((P, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx, data=t, vals=m.ap([[1, P], [0, 8]]))
    return store(idx)


@pytest.mark.parametrize("target", V3)
def test_nc_find_index8_broadcast_vals(target):
    x = distinct_rows((P, 64), 245)
    got = run(k_find_index_broadcast_vals, target, x)
    assert np.array_equal(got, np.repeat(np.argmax(x, axis=1)[:, None], 8, axis=1))


def k_reduce_permuted(x):
    """tensor_reduce on a permuted 3-D view (attention_tkg: axis=[4], keepdims=False), the last dim reduced."""
    t = load(x)  # (P, a, b)
    v = t.permute((0, 2, 1))  # (P, b, a)
    d = nl.ndarray((P, x.shape[2]), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=d, op=nl.maximum, data=v, axis=[4], keepdims=False)
    return store(d)


@pytest.mark.parametrize("target", V3)
def test_tensor_reduce_permuted_view(target):
    x = normal((P, 6, 10), 246)
    assert np.array_equal(run(k_reduce_permuted, target, x), x.max(axis=1))


def k_memset_5d(x):
    m = nl.ndarray((P, 2, 3, 2, 4), nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=m, value=0)
    nisa.memset(dst=m[:, 1, :, 0, :], value=1)
    return store(m)


@pytest.mark.parametrize("target", V2)
def test_memset_5d_tile_and_strided_view(target):
    got = run(k_memset_5d, target, np.zeros((1, 1), np.float32))
    want = np.zeros((P, 2, 3, 2, 4), np.uint8)
    want[:, 1, :, 0, :] = 1
    assert np.array_equal(got, want)


# ================================================================ LNC=2: exchanges between the two programs
def k_sendrecv(x):
    """Each program sends its 128-row half to the other and adds what it receives (softmax-max style)."""
    R, F = x.shape
    out = nl.ndarray((R, F), nl.float32, buffer=nl.shared_hbm)
    pid = nl.program_id(axis=0)
    mine = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[nl.ds(pid * P, P), :])
    theirs = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    s = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=mine, data2=theirs, op=nl.subtract)  # mine - theirs
    nisa.dma_copy(dst=out[nl.ds(pid * P, P), :], src=s)
    return out


@pytest.mark.parametrize("target", V3)
def test_sendrecv_between_lnc_programs(target):
    x = normal((256, 32), 250)
    got = nki.jit(k_sendrecv, platform_target=target)[2](x)
    assert np.array_equal(got[:128], x[:128] - x[128:]) and np.array_equal(got[128:], x[128:] - x[:128])


def k_core_barrier(x):
    """Each program writes its half of a shared_hbm tensor, waits at the barrier, reads the other half."""
    R, F = x.shape
    shared = nl.ndarray((R, F), nl.float32, buffer=nl.shared_hbm)
    out = nl.ndarray((R, F), nl.float32, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    t = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[nl.ds(pid * P, P), :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=shared[nl.ds(pid * P, P), :], src=t)
    nisa.core_barrier(shared, (0, 1))
    u = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=shared[nl.ds((1 - pid) * P, P), :])
    nisa.dma_copy(dst=out[nl.ds(pid * P, P), :], src=u)
    return out


@pytest.mark.parametrize("target", V3)
def test_core_barrier_orders_shared_hbm(target):
    x = normal((256, 32), 251)
    got = nki.jit(k_core_barrier, platform_target=target)[2](x)
    f = np.float32(3)
    assert np.array_equal(got[:128], x[128:] * f) and np.array_equal(got[128:], x[:128] * f)


def k_dynamic_range_register(x, count):
    """bwmm's hybrid loop: a trip count loaded into a register, nl.dynamic_range(start, reg)."""
    c = load(count)
    reg = nisa.register_alloc()
    nisa.register_load(reg, c)
    acc = nl.ndarray((P, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    t = load(x)
    for _ in nl.dynamic_range(0, reg):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    return store(acc)


@pytest.mark.xfail(strict=True, reason="tern gap: nisa.register_alloc / register_load (runtime trip counts for "
                   "nl.dynamic_range) raise NotImplementedError")
@pytest.mark.parametrize("target", V3)
def test_dynamic_range_with_a_register_trip_count(target):
    x = ints_as_f32((P, 8), -5, 5, 252)
    got = run(k_dynamic_range_register, target, x, np.array([[3]], np.int32))
    assert np.array_equal(got, 3 * x)


def k_returns_reshaped(x):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=load(x))
    return out.reshape((x.shape[0] * 2, x.shape[1] // 2))  # router_topk returns reshaped views


@pytest.mark.parametrize("target", V3)
def test_returning_a_reshaped_output(target):
    x = normal((P, 16), 253)
    got = run(k_returns_reshaped, target, x)
    assert got.shape == (256, 8) and np.array_equal(got, x.reshape(256, 8))


@pytest.mark.parametrize("target", V3)
def test_bool_and_fp16_inputs(target):
    x, y = normal((P, 32), 254).astype(np.float16), normal((P, 32), 255).astype(np.float16)
    mask = rng(256).random((P, 32)) < 0.5  # numpy bool: a uint8 predicate
    got = run(k_copy_predicated, target, x, y, mask, False)
    assert got.dtype == np.float16 and np.array_equal(got, np.where(mask, y, x))
    tm = torch.from_numpy(mask)
    got_t = run(k_copy_predicated, target, torch.from_numpy(x), torch.from_numpy(y), tm, True)
    assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.float16
    assert np.array_equal(got_t.numpy(), np.where(~mask, y, x))
