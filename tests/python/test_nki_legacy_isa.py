"""Legacy NKI: the matmul tutorials and nki.isa calls that return tiles
(mask=, dtype=), against numpy."""
import math
import os
import subprocess
import sys
import textwrap
import numpy as np
import pytest
import tern.nki
tern.nki.install()
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402
import neuronxcc.nki.typing as nt  # noqa: E402
from nki_legacy_helpers import *  # noqa: F401,F403
from nki_current_helpers import segment_runs  # noqa: E402


# =====================================================================
# Matmul tutorials
# =====================================================================
def matmul_basic_kernel(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_lhsT_p, i_lhsT_f = nl.mgrid[0:K, 0:M]
    i_rhs_p, i_rhs_f = nl.mgrid[0:K, 0:N]
    i_out_p, i_out_f = nl.mgrid[0:M, 0:N]
    lhs_tile = nl.load(lhsT[i_lhsT_p, i_lhsT_f])
    rhs_tile = nl.load(rhs[i_rhs_p, i_rhs_f])
    result_psum = nl.matmul(lhs_tile, rhs_tile, transpose_x=True)
    result_sbuf = nl.copy(result_psum, dtype=result.dtype)
    nl.store(result[i_out_p, i_out_f], value=result_sbuf)
    return result


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_basic(target, dtype):
    """fp32 (and fp16: small integers, every sum exact in fp16) operands,
    PSUM fp32 accumulation, nl.copy(psum, dtype=result.dtype)."""
    lo, hi = (-8, 9) if dtype == np.float32 else (-2, 3)
    lhsT = ints((128, 64), lo, hi, seed=50).astype(dtype)
    rhs = ints((128, 512), lo, hi, seed=51).astype(dtype)
    want = (lhsT.astype(np.float32).T @ rhs.astype(np.float32)).astype(dtype)
    assert_exact(run(matmul_basic_kernel, target, lhsT, rhs), want)


def matmul_tiled_kernel(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = 128, 128, 256
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            res_psum = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                lhsT_tile = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                lhsT_tile[...] = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                rhs_tile[...] = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                res_psum += nl.matmul(lhsT_tile[...], rhs_tile[...], transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=res_sb)
    return result


def test_matmul_tiled_psum_accumulation(target):
    lhsT = ints((384, 256), seed=52)
    rhs = ints((384, 512), seed=53)
    assert_exact(run(matmul_tiled_kernel, target, lhsT, rhs), lhsT.T @ rhs)


def matmul_hoisted_kernel(lhsT, rhs):
    """Hoisted loads into (K/128, par_dim(128), F) block buffers indexed
    [k, ip, if], psum[...] += nl.matmul(...)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = 128, 128, 256
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_lp, i_lf = nl.mgrid[0:TK, 0:TM]
    i_rp, i_rf = nl.mgrid[0:TK, 0:TN]
    i_op, i_of = nl.mgrid[0:TM, 0:TN]
    for m in nl.affine_range(M // TM):
        lhsT_tiles = nl.ndarray((K // TK, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TK):
            lhsT_tiles[k, i_lp, i_lf] = nl.load(lhsT[k * TK + i_lp, m * TM + i_lf])
        for n in nl.affine_range(N // TN):
            rhs_tiles = nl.ndarray((K // TK, nl.par_dim(TK), TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TK):
                rhs_tiles[k, i_rp, i_rf] = nl.load(rhs[k * TK + i_rp, n * TN + i_rf])
            res_psum = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                res_psum[...] += nl.matmul(lhsT_tiles[k, i_lp, i_lf], rhs_tiles[k, i_rp, i_rf], transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TM + i_op, n * TN + i_of], value=res_sb)
    return result


def test_matmul_hoisted_par_dim(target):
    lhsT = ints((256, 256), seed=54)
    rhs = ints((256, 512), seed=55)
    assert_exact(run(matmul_hoisted_kernel, target, lhsT, rhs), lhsT.T @ rhs)


def matmul_blocked_kernel(lhsT, rhs):
    """Block-K accumulation in SBUF: a (M/128, 1, par_dim(128), N) result
    buffer, res_psum += nisa.nc_matmul(stationary, moving) and an SBUF
    result_tiles[m, 0, ip, if] += res_psum[ip, if] across K blocks."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = 128, 128, 512
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    result_tiles = nl.zeros((M // TM, 1, nl.par_dim(TM), N), dtype=nl.float32, buffer=nl.sbuf)
    i_p, i_f = nl.mgrid[0:TM, 0:TN]
    for kb in nl.sequential_range(K // (2 * TK)):
        lhsT_tiles = nl.ndarray((2, nl.par_dim(TK), M), dtype=lhsT.dtype, buffer=nl.sbuf)
        rhs_tiles = nl.ndarray((2, nl.par_dim(TK), N), dtype=rhs.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(2):
            row = (2 * kb + k) * TK
            lhsT_tiles[k] = nl.load(lhsT[row:row + TK, :])
            rhs_tiles[k] = nl.load(rhs[row:row + TK, :])
        for m in nl.affine_range(M // TM):
            for n in nl.affine_range(N // TN):
                res_tile = nl.zeros((TM, TN), dtype=nl.float32, buffer=nl.psum)
                for k in nl.affine_range(2):
                    res_tile[...] += nisa.nc_matmul(lhsT_tiles[k, :, m * TM:(m + 1) * TM],
                                                    rhs_tiles[k, :, n * TN:(n + 1) * TN])
                result_tiles[m, 0, i_p, n * TN + i_f] += res_tile[i_p, i_f]
    for m in nl.affine_range(M // TM):
        nl.store(result[m * TM:(m + 1) * TM, :], value=result_tiles[m, 0])
    return result


def test_matmul_blocked_nc_matmul_sbuf_accumulation(target):
    lhsT = ints((512, 256), seed=56)
    rhs = ints((512, 512), seed=57)
    assert_exact(run(matmul_blocked_kernel, target, lhsT, rhs), lhsT.T @ rhs)


def test_nc_matmul_plus_equals_accumulates(target):
    """res_psum += nisa.nc_matmul(stationary, moving) over K tiles with the
    operands passed by keyword."""
    a = ints((256, 128), seed=58)
    b = ints((256, 384), seed=59)

    def kernel(lhsT, rhs):
        K, M = lhsT.shape
        res = nl.zeros((M, rhs.shape[1]), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            st = nl.load(lhsT[k * 128:(k + 1) * 128, :])
            mv = nl.load(rhs[k * 128:(k + 1) * 128, :])
            res += nisa.nc_matmul(stationary=st, moving=mv)
        single = nisa.nc_matmul(nl.load(lhsT[0:128, :]), nl.load(rhs[0:128, :]))
        return store_new(nl.copy(res)), store_new(nisa.tensor_copy(single))

    acc, single = run(kernel, target, a, b)
    assert_exact(acc, a.T @ b)
    assert_exact(single, a[:128].T @ b[:128])


def test_matmul_loop_reduce_k_blocks(target):
    """The contributed blocked matmul: Z_SBUF[m, :, cols] =
    nl.loop_reduce(Z_PSUM, op=np.add, loop_indices=[k2]) over K blocks."""
    a = ints((256, 128), seed=60)
    b = ints((256, 256), seed=61)

    def kernel(A, B):
        K, M = A.shape
        N = B.shape[1]
        Z = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        Z_SBUF = nl.zeros((1, nl.par_dim(128), N), dtype=nl.float32, buffer=nl.sbuf)
        for k2 in nl.affine_range(K // 128):
            a_t = nl.load(A[k2 * 128:(k2 + 1) * 128, :])
            b_t = nl.load(B[k2 * 128:(k2 + 1) * 128, :])
            Z_PSUM = nl.zeros((128, N), dtype=nl.float32, buffer=nl.psum)
            Z_PSUM += nisa.nc_matmul(a_t, b_t)
            Z_SBUF[0, :, 0:N] = nl.loop_reduce(Z_PSUM, op=np.add, loop_indices=[k2], dtype=nl.float32)
        nl.store(Z, value=Z_SBUF[0])
        return Z

    assert_exact(run(kernel, target, a, b), a.T @ b)


def test_assignment_forms_and_broadcast_compare(target):
    """psum[:, :] = nl.matmul(...); psum[:, :] = 0 then += twice; integer
    free-dim destinations buf[:, i] = reduction (attention's m_buffer[:, 0]
    and row_max[:, i]); nl.divide(1.0, t); nl.equal of (P, a, 1) against
    (P, a, b) with dtype=nl.int8."""
    a = ints((128, 128), -4, 5, seed=62)
    b = ints((128, 64), -4, 5, seed=63)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        ps[:, :] = nl.matmul(x, y, transpose_x=True)
        ps2 = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        ps2[:, :] = 0
        ps2 += nl.matmul(x, y, transpose_x=True)
        ps2 += nl.matmul(x, y, transpose_x=True)
        mbuf = nl.zeros((128, 4), dtype=nl.float32)
        mbuf[:, 0] = nl.maximum(nl.max(y, axis=1), nl.min(y, axis=1))
        for i in nl.static_range(2):
            mbuf[:, 1 + i] = nisa.tensor_reduce(np.max, data=y[:, i * 32:(i + 1) * 32], axis=(1,))
        mbuf[:, 3] = nl.sum(y, axis=1)
        r = nl.divide(1.0, nl.add(nl.abs(y), 1.0))
        y3 = y.reshape((128, 8, 8))
        eq = nl.equal(y3, nl.max(y3, axis=[2], keepdims=True), dtype=nl.int8)
        return tuple(store_new(t) for t in (nl.copy(ps), nl.copy(ps2), mbuf, r, eq))

    p, p2, m, r, eq = run(kernel, target, a, b)
    assert_exact(p, a.T @ b)
    assert_exact(p2, 2 * (a.T @ b))
    assert_exact(m, np.stack([np.maximum(b.max(1), b.min(1)), b[:, :32].max(1), b[:, 32:].max(1), b.sum(1)], 1))
    assert_exact(r, (1 / (np.abs(b) + 1)).astype(np.float32))
    b3 = b.reshape(128, 8, 8)
    assert_exact(eq, (b3 == b3.max(axis=2, keepdims=True)).astype(np.int8))


def test_matmul_python_bool_mask_true(target):
    """nisa.nc_matmul(a, b, mask=True / None): the attention backward's
    bool masks when they hold."""
    a = ints((128, 128), seed=64)
    b = ints((128, 64), seed=65)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        ps = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(x, y, mask=True)
        ps += nisa.nc_matmul(x, y, mask=None)
        return store_new(nl.copy(ps))

    assert_exact(run(kernel, target, a, b), 2 * (a.T @ b))


def test_matmul_python_bool_mask_false_skips(target):
    a = ints((128, 128), seed=66)
    b = ints((128, 64), seed=67)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        ps = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(x, y, mask=True)
        ps += nisa.nc_matmul(x, y, mask=False)
        return store_new(nl.copy(ps))

    assert_exact(run(kernel, target, a, b), a.T @ b)


# =====================================================================
# 4. ISA calls returning tiles
# =====================================================================
def test_isa_tensor_scalar_tensor_tensor(target):
    a = exact((128, 64), seed=70)
    b = exact((128, 64), seed=71)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        col = nisa.tensor_reduce(np.max, data=x, axis=(1,), keepdims=True)
        outs = [
            nisa.tensor_scalar(data=x, op0=np.subtract, operand0=col, op1=np.multiply, operand1=0.5),
            nisa.tensor_scalar(x, nl.multiply, 2.0, op1=nl.add, operand1=1.0, dtype=nl.float16),
            nisa.tensor_scalar(data=x, op0=nl.subtract, operand0=1.0, reverse0=True, engine=nisa.vector_engine),
            nisa.tensor_tensor(x, y, op=nl.multiply),
            nisa.tensor_tensor(data1=x, data2=y, op=np.add),
            nisa.tensor_tensor(x, y, nl.maximum),
            nisa.tensor_tensor(x, y, op=nl.subtract, dtype=nl.float16),
        ]
        return tuple(store_new(o) for o in outs)

    outs = run(kernel, target, a, b)
    wants = [(a - a.max(axis=1, keepdims=True)) * 0.5, (a * 2 + 1).astype(np.float16), 1 - a, a * b, a + b,
             np.maximum(a, b), (a - b).astype(np.float16)]
    for o, w in zip(outs, wants):
        assert_exact(o, w)


def test_isa_activation_bias_scale_reduce(target):
    r = np.random.default_rng(72)
    a = r.uniform(-2, 2, (128, 64)).astype(np.float32)
    s = exact((128, 1), seed=73)
    e = exact((128, 64), seed=74)

    def kernel(a_in, s_in, e_in):
        x, sc, ex = nl.load(a_in), nl.load(s_in), nl.load(e_in)
        neg_max = nisa.tensor_reduce(np.max, data=x, axis=(1,), negate=True, keepdims=True)
        sums = nl.zeros((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        e1 = nisa.activation(op=nl.exp, data=x, bias=neg_max, scale=1.0, reduce_op=nl.add,
                             reduce_res=sums[:, 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        e2 = nisa.activation(np.exp, x, bias=neg_max, scale=2.0)
        c1 = nisa.activation(op=nl.copy, data=ex, scale=sc)  # per-partition scale tile (mamba)
        c2 = nisa.activation(op=nl.copy, data=ex, bias=sc, scale=0.5, dtype=nl.float16)
        sq_sum = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        sq = nisa.activation_reduce(op=nl.square, data=ex, reduce_op=np.add, reduce_res=sq_sum)
        return tuple(store_new(o) for o in (e1, sums, e2, c1, c2, sq, sq_sum))

    e1, sums, e2, c1, c2, sq, sq_sum = run(kernel, target, a, s, e)
    mx = a.max(axis=1, keepdims=True)
    want_e1 = np.exp(a - mx)
    np.testing.assert_allclose(e1, want_e1, rtol=RTOL)
    np.testing.assert_allclose(sums[:, 1], want_e1.sum(axis=1), rtol=RTOL)
    assert np.all(sums[:, 0] == 0)
    np.testing.assert_allclose(e2, np.exp(2 * a - mx), rtol=RTOL)
    assert_exact(c1, e * s)
    assert_exact(c2, (e * 0.5 + s).astype(np.float16))
    assert_exact(sq, e * e)
    assert_exact(sq_sum, (e * e).sum(axis=1, keepdims=True))


def test_isa_tensor_reduce_and_copy(target):
    a = exact((128, 4, 16), seed=75)

    def kernel(a_in):
        x = nl.load(a_in)
        outs = [nisa.tensor_reduce(np.max, data=x, axis=(1, 2), negate=True, keepdims=True),
                nisa.tensor_reduce(op=nl.add, data=x, axis=2),
                nisa.tensor_reduce(nl.min, x, axis=[2], keepdims=True, dtype=nl.float16),
                nisa.tensor_copy(x, dtype=nl.float16),
                nisa.tensor_copy(src=x, engine=nisa.scalar_engine)]
        return tuple(store_new(o) for o in outs)

    neg, sm, mn, h, c = run(kernel, target, a)
    assert_exact(neg, -a.max(axis=(1, 2), keepdims=True))
    assert_exact(sm, a.sum(axis=2))
    assert_exact(mn, a.min(axis=2, keepdims=True).astype(np.float16))
    assert_exact(h, a.astype(np.float16))
    assert_exact(c, a)


def test_isa_nc_transpose(target):
    a = exact((128, 96), seed=76)
    v = exact((32, 32), seed=77)

    def kernel(a_in, v_in):
        t = nisa.nc_transpose(nl.load(a_in))
        assert t.shape == (96, 128)
        tv = nisa.nc_transpose(nl.load(v_in), engine=nisa.vector_engine)
        return store_new(nisa.tensor_copy(t)), store_new(tv)

    t, tv = run(kernel, target, a, v)
    assert_exact(t, a.T.copy())
    assert_exact(tv, v.T.copy())


def test_isa_iota(target):
    def kernel():
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        i1, i2 = nl.mgrid[0:3, 0:4]
        a = nisa.iota(ip * 64 + jf, dtype=nl.int32)
        b = nisa.iota(2 * jf - ip + 5, dtype=nl.float32)
        c = nisa.iota(nl.arange(8)[None, :], dtype=nl.uint32)
        d = nisa.iota(4 * i1 + i2, dtype=nl.float32)
        return store_new(a), store_new(b), store_new(c), store_new(d)

    a, b, c, d = run(kernel, target)
    p, f = np.mgrid[0:128, 0:64]
    assert_exact(a, (p * 64 + f).astype(np.int32))
    assert_exact(b, (2 * f - p + 5).astype(np.float32))
    assert_exact(c, np.arange(8, dtype=np.uint32)[None, :])
    assert_exact(d, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_isa_affine_select_causal(target):
    """affine_select(pred=(i_p >= i_f), on_true_tile, on_false_value): the
    causal mask, and a tile offset (i_q*128 + ip >= jf) on a wider tile."""
    a = exact((128, 128), seed=78)
    w = exact((128, 256), seed=79)

    def kernel(a_in, w_in):
        x = nl.load(a_in)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(128)[None, :]
        causal = nisa.affine_select(pred=(ip >= jf), on_true_tile=x, on_false_value=-9984.0)
        i_q = 1
        ip2 = nl.arange(128)[:, None]
        jf2 = nl.arange(256)[None, :]
        banded = nisa.affine_select(pred=(i_q * 64 + ip2 >= jf2), on_true_tile=nl.load(w_in),
                                    on_false_value=nl.fp32.min, dtype=nl.float32)
        strict = nisa.affine_select(pred=(jf > ip), on_true_tile=x, on_false_value=0.0)
        return store_new(causal), store_new(banded), store_new(strict)

    causal, banded, strict = run(kernel, target, a, w)
    p, f = np.mgrid[0:128, 0:128]
    assert_exact(causal, np.where(p >= f, a, np.float32(-9984.0)))
    p2, f2 = np.mgrid[0:128, 0:256]
    assert_exact(banded, np.where(64 + p2 >= f2, w, np.float32(nl.fp32.min)))
    assert_exact(strict, np.where(f > p, a, np.float32(0.0)))


def test_isa_affine_select_on_psum_matmul_result(target):
    q = ints((64, 128), seed=80)
    k = ints((64, 128), seed=81)

    def kernel(q_in, k_in):
        qk = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        qk += nisa.nc_matmul(stationary=nl.load(q_in), moving=nl.load(k_in))
        ip = nl.arange(128)[:, None]
        jf = nl.arange(128)[None, :]
        return store_new(nisa.affine_select(pred=(ip >= jf), on_true_tile=qk, on_false_value=-9984.0,
                                            dtype=nl.float32))

    p, f = np.mgrid[0:128, 0:128]
    assert_exact(run(kernel, target, q, k), np.where(p >= f, q.T @ k, np.float32(-9984.0)))


def test_isa_memset_reciprocal(target):
    r = np.random.default_rng(81)
    a = r.uniform(0.25, 8, (128, 64)).astype(np.float32)
    p = np.abs(pow2((128, 64), seed=82))

    def kernel(a_in, p_in):
        m1 = nisa.memset((128, 64), value=3.5, dtype=nl.float32)
        m2 = nisa.memset(shape=(64, 1), value=-2, dtype=nl.int32)
        r1 = nisa.reciprocal(nl.load(a_in))
        r2 = nisa.reciprocal(data=nl.load(p_in))
        return store_new(m1), store_new(m2), store_new(r1), store_new(r2)

    m1, m2, r1, r2 = run(kernel, target, a, p)
    assert_exact(m1, np.full((128, 64), 3.5, np.float32))
    assert_exact(m2, np.full((64, 1), -2, np.int32))
    np.testing.assert_allclose(r1, 1 / a, rtol=RTOL)
    assert_exact(r2, 1 / p)


def test_isa_tensor_tensor_scan(target):
    """r[i] = data0[i] * r[i-1] + data1[i] (mamba's scan) with a scalar and a
    [P, 1] tile as the initial value."""
    r = np.random.default_rng(83)
    d0 = r.choice([-1.0, 0.0, 1.0, 0.5], size=(128, 48)).astype(np.float32)
    d1 = exact((128, 48), seed=84)
    init = exact((128, 1), seed=85)

    def kernel(a_in, b_in, i_in):
        a, b, i0 = nl.load(a_in), nl.load(b_in), nl.load(i_in)
        s1 = nisa.tensor_tensor_scan(a, b, initial=0, op0=np.multiply, op1=np.add)
        s2 = nisa.tensor_tensor_scan(data0=a, data1=b, initial=i0, op0=nl.multiply, op1=nl.add)
        return store_new(s1), store_new(s2)

    def ref(init_col):
        out = np.empty_like(d0)
        prev = init_col[:, 0].astype(np.float32)
        for i in range(d0.shape[1]):
            prev = (d0[:, i] * prev).astype(np.float32) + d1[:, i]
            out[:, i] = prev
        return out

    s1, s2 = run(kernel, target, d0, d1, init)
    assert_exact(s1, ref(np.zeros((128, 1), np.float32)))
    assert_exact(s2, ref(init))


def test_isa_max8_find_index8_match_replace8(target):
    r = np.random.default_rng(86)
    a = np.stack([r.permutation(64) for _ in range(128)]).astype(np.float32) - 20.0

    def kernel(a_in):
        x = nl.load(a_in)
        top = nisa.max8(src=x)
        idx = nisa.nc_find_index8(data=x, vals=top)
        rep = nisa.nc_match_replace8(data=x, vals=top, imm=-1000.0)
        assert top.shape == (128, 8) and idx.shape == (128, 8)
        return store_new(top), store_new(idx), store_new(rep)

    top, idx, rep = run(kernel, target, a)
    order = np.argsort(-a, axis=1, kind="stable")[:, :8]
    assert_exact(top, np.take_along_axis(a, order, axis=1))
    np.testing.assert_array_equal(np.asarray(idx).astype(np.int64), order)
    want_rep = a.copy()
    np.put_along_axis(want_rep, order, -1000.0, axis=1)
    assert_exact(rep, want_rep)


def test_isa_sequence_bounds(target):
    ids = np.array([[0, 4, 4, 1, 1, 1, 0, 0, 2, 4, 4]], np.float32)

    def kernel(ids_in):
        ix, iy, iz = nl.mgrid[0:1, 0:2, 0:ids_in.shape[1]]
        out = nl.ndarray((1, 2, ids_in.shape[1]), dtype=ids_in.dtype, buffer=nl.sbuf)
        out[ix, iy, iz] = nisa.sequence_bounds(segment_ids=nl.load(ids_in))
        return store_new(out)

    assert_exact(run(kernel, target, ids), segment_runs(ids[0])[None].astype(np.float32))


@pytest.mark.parametrize("n", [1024, 768])
def test_isa_bn_stats_bn_aggr(target, n):
    """layernorm v2: per-chunk nisa.bn_stats into [P, 6*n] (masked chunks),
    nisa.bn_aggr to mean / variance, then tensor_scalar with numpy ufuncs."""
    r = np.random.default_rng(87)
    x = (r.standard_normal((128, n)) * 2 + 1).astype(np.float32)

    def kernel(a_in):
        n = a_in.shape[1]
        fmax = nl.tile_size.bn_stats_fmax
        nch = math.ceil(n / fmax)
        ip = nl.arange(128)[:, None]
        i_bn = nl.arange(fmax)[None, :]
        i6 = nl.arange(6)[None, :]
        t = nl.load(a_in)
        stats = nl.ndarray((128, 6 * nch), dtype=np.float32)
        for j in nl.affine_range(nch):
            stats[ip, j * 6 + i6] = nisa.bn_stats(t[ip, j * fmax + i_bn], mask=(j * fmax + i_bn < n),
                                                  dtype=np.float32)
        mv = nisa.bn_aggr(stats)
        mean = mv[:, 0]
        var = mv[:, 1]
        rstd = nisa.activation(op=nl.rsqrt, data=var, bias=None, scale=1.0)
        norm = nisa.tensor_scalar(data=t, op0=np.subtract, operand0=mean, op1=np.multiply, operand1=rstd)
        return store_new(mv), store_new(norm)

    mv, norm = run(kernel, target, x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mv[:, 0], x64.mean(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], x64.var(axis=1), rtol=1e-5)
    np.testing.assert_allclose(norm, (x64 - x64.mean(axis=1, keepdims=True)) / x64.std(axis=1, keepdims=True),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_isa_dma_transpose(target, dtype):
    a = exact((64, 128), seed=88)
    arg = tern.nki.typed(a, nl.bfloat16) if dtype == "bfloat16" else a.astype(np.float16)

    def kernel(a_in):
        t = nl.load(a_in)
        tt = nisa.dma_transpose(t)
        assert tt.shape == (128, 64)
        return store_new(nl.copy(tt, dtype=nl.float32))

    assert_exact(run(kernel, target, arg), a.T.copy())


def test_isa_masks(target):
    """mask= on nisa calls: partition and free-dim predicates; masked
    tensor_reduce reduces only the kept columns."""
    a = exact((128, 64), seed=89)
    b = exact((128, 64), seed=90)
    o1 = np.full((128, 64), 9.0, np.float32)
    o2 = np.full((128, 64), 9.0, np.float32)
    o3 = np.full((128, 64), 9.0, np.float32)

    def kernel(a_in, b_in, out1, out2, out3):
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        x = nl.load(a_in[ip, jf])
        y = nl.load(b_in[ip, jf])
        mp = (ip < 96)
        r1 = nisa.tensor_scalar(data=x[ip, jf], op0=nl.multiply, operand0=4.0, mask=mp)
        nl.store(out1[ip, jf], value=r1, mask=mp)
        mf = (jf >= 10) & (jf < 50)
        r2 = nisa.tensor_tensor(x[ip, jf], y[ip, jf], op=nl.add, mask=mf)
        nl.store(out2[ip, jf], value=r2, mask=mf)
        r3 = nisa.tensor_copy(x[ip, jf], mask=mp & (jf < 32))
        nl.store(out3[ip, jf], value=r3, mask=mp & (jf < 32))
        red = nisa.tensor_reduce(np.max, data=x[ip, jf], axis=(1,), keepdims=True, mask=(jf < 16))
        return store_new(red)

    red = run(kernel, target, a, b, o1, o2, o3)
    w1 = np.full((128, 64), 9.0, np.float32)
    w1[:96] = a[:96] * 4
    w2 = np.full((128, 64), 9.0, np.float32)
    w2[:, 10:50] = (a + b)[:, 10:50]
    w3 = np.full((128, 64), 9.0, np.float32)
    w3[:96, :32] = a[:96, :32]
    assert_exact(o1, w1)
    assert_exact(o2, w2)
    assert_exact(o3, w3)
    assert_exact(red, a[:, :16].max(axis=1, keepdims=True))


def test_isa_activation_mask(target):
    r = np.random.default_rng(91)
    a = r.uniform(-1, 1, (128, 32)).astype(np.float32)
    out = np.full((128, 32), 9.0, np.float32)

    def kernel(a_in, o):
        ip = nl.arange(128)[:, None]
        jf = nl.arange(32)[None, :]
        x = nl.load(a_in[ip, jf])
        e = nisa.activation(op=nl.exp, data=x[ip, jf], mask=(ip < 50))
        nl.store(o[ip, jf], value=e, mask=(ip < 50))

    run(kernel, target, a, out)
    np.testing.assert_allclose(out[:50], np.exp(a[:50]), rtol=RTOL)
    assert np.all(out[50:] == 9.0)
