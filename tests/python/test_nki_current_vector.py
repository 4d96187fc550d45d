"""Current NKI API: the Vector and GpSimd engines' elementwise, reduction,
copy, fill and pattern calls, against numpy, bit-exact where the arithmetic
is defined."""
import dataclasses
import math
import numpy as np
import pytest
import torch
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


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


def k_stt_accumulate(g, acc):
    """acc = g * 0.5 + acc (attention backward's dq update): operand1 is dst; a bf16 dst rounds once."""
    a = nl.ndarray(acc.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=a, src=load(acc))
    nisa.scalar_tensor_tensor(dst=a, data=load(g), op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=a)
    r = nl.ndarray(acc.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=a)
    return store(r)


@pytest.mark.parametrize("target", V3)
def test_scalar_tensor_tensor_with_dst_as_operand1(target):
    g, acc = normal((P, 32), 59), bf16_round(normal((P, 32), 60))
    got = run(k_stt_accumulate, target, g, acc)
    assert np.array_equal(got, bf16_round(g * np.float32(0.5) + acc))


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


def k_long_row(x):
    """A partition of 65,600 elements: longer than one access-pattern dim counts, split in two."""
    t = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    return store(t, nl.float32)


@pytest.mark.parametrize("target", V3)
def test_rows_longer_than_an_access_pattern_dim(target):
    x = (np.arange(65600) % 200).astype(np.float32).reshape(1, 65600)
    assert np.array_equal(run(k_long_row, target, x), 2 * x)
