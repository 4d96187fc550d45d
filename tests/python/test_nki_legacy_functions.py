"""Legacy NKI: the nki.language tile functions (math, reductions, transpose,
matmul, where, loads and stores) and the tutorials built on them."""
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


# =====================================================================
# 3. Tile functions
# =====================================================================
def test_unary_functions(target):
    r = np.random.default_rng(30)
    a = r.uniform(0.1, 4.0, (128, 64)).astype(np.float32)
    e = r.uniform(-4.0, 4.0, (128, 64)).astype(np.float32)
    s = exact((128, 64), seed=31)

    def kernel(a_in, e_in, s_in):
        x, ex, sx = nl.load(a_in), nl.load(e_in), nl.load(s_in)
        outs = [nl.exp(ex), nl.rsqrt(x), nl.sqrt(x), nl.reciprocal(x), nl.square(sx), nl.abs(sx),
                nl.copy(sx)]
        return tuple(store_new(o) for o in outs)

    exp_, rsqrt, sqrt, rec, sq, ab, cp = run(kernel, target, a, e, s)
    np.testing.assert_allclose(exp_, np.exp(e), rtol=RTOL)
    np.testing.assert_allclose(rsqrt, 1 / np.sqrt(a), rtol=RTOL)
    np.testing.assert_allclose(sqrt, np.sqrt(a), rtol=RTOL)
    np.testing.assert_allclose(rec, 1 / a, rtol=RTOL)
    assert_exact(sq, s * s)
    assert_exact(ab, np.abs(s))
    assert_exact(cp, s)


def test_copy_and_load_dtype_casts(target):
    a = exact((128, 64), seed=32)

    def kernel(a_in):
        x = nl.load(a_in)
        h = nl.copy(x, dtype=nl.float16)
        bf = nl.copy(x, dtype=nl.bfloat16)
        lh = nl.load(a_in, dtype=nl.float16)
        back = nl.copy(lh, dtype=nl.float32)
        assert h.dtype == nl.float16 and lh.dtype == nl.float16
        return store_new(h), store_new(bf), store_new(lh), store_new(back)

    h, bf, lh, back = run(kernel, target, a)
    assert_exact(h, a.astype(np.float16))
    assert getattr(bf, "nki_dtype", None) == "bfloat16"
    assert_exact(tern.nki.to_float32(bf), a)
    assert_exact(lh, a.astype(np.float16))
    assert_exact(back, a)


def test_binary_functions_dtype_and_mask(target):
    a = exact((128, 64), seed=33)
    b = pow2((128, 64), seed=34)
    o_mask = np.full((128, 64), 5.0, np.float32)

    def kernel(a_in, b_in, o_m):
        x, y = nl.load(a_in), nl.load(b_in)
        outs = [nl.add(x, y), nl.subtract(x, y, dtype=nl.float16), nl.multiply(x, y),
                nl.divide(x, y), nl.maximum(x, y), nl.minimum(x, y, dtype=nl.float16),
                nl.maximum(x, 0.0), nl.minimum(x, 1.0), nl.add(x, y, dtype=nl.bfloat16)]
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        m = (ip < 100) & (jf >= 8)
        mm = nl.multiply(x[ip, jf], y[ip, jf], mask=m)
        nl.store(o_m[ip, jf], value=mm, mask=m)
        return tuple(store_new(o) for o in outs)

    outs = run(kernel, target, a, b, o_mask)
    wants = [a + b, (a - b).astype(np.float16), a * b, a / b, np.maximum(a, b),
             np.minimum(a, b).astype(np.float16), np.maximum(a, 0), np.minimum(a, 1)]
    for o, w in zip(outs, wants):
        assert_exact(o, w.astype(w.dtype))
    assert outs[-1].nki_dtype == "bfloat16"
    assert_exact(tern.nki.to_float32(outs[-1]), a + b)
    want_m = np.full((128, 64), 5.0, np.float32)
    want_m[:100, 8:] = (a * b)[:100, 8:]
    assert_exact(o_mask, want_m)


def test_reductions_axes_keepdims(target):
    a = exact((128, 4, 8), seed=35)

    def kernel(a_in):
        x = nl.load(a_in)
        r = [nl.max(x, axis=[1, 2], keepdims=True), nl.min(x, axis=2, keepdims=True), nl.sum(x, axis=2),
             nl.mean(x, axis=[1, 2], keepdims=True), nl.max(x, axis=1), nl.min(x, axis=(1, 2), keepdims=True),
             nl.sum(x, axis=-1, keepdims=True)]
        assert r[0].shape == (128, 1, 1) and r[1].shape == (128, 4, 1) and r[2].shape == (128, 4)
        assert r[4].shape == (128, 8)
        return tuple(store_new(t) for t in r)

    outs = run(kernel, target, a)
    wants = [a.max(axis=(1, 2), keepdims=True), a.min(axis=2, keepdims=True), a.sum(axis=2),
             a.mean(axis=(1, 2), keepdims=True, dtype=np.float32), a.max(axis=1),
             a.min(axis=(1, 2), keepdims=True), a.sum(axis=-1, keepdims=True)]
    for o, w in zip(outs, wants):
        assert_exact(o, w.astype(np.float32))


def test_reductions_2d_no_keepdims(target):
    a = exact((128, 40), seed=36)

    def kernel(a_in):
        x = nl.load(a_in)
        r = [nl.max(x, axis=1), nl.min(x, axis=[1]), nl.sum(x, axis=1), nl.mean(x, axis=1)]
        return tuple(store_new(t) for t in r)

    outs = run(kernel, target, a)
    wants = [a.max(axis=1), a.min(axis=1), a.sum(axis=1)]
    for o, w in zip(outs, wants):
        np.testing.assert_array_equal(np.asarray(o).reshape(-1), w.astype(np.float32))
    assert outs[0].dtype == np.float32
    # the mean of 40 values: sum * (1/40) in fp32 (1/40 is inexact): rtol 1e-6
    np.testing.assert_allclose(np.asarray(outs[3]).reshape(-1), a.astype(np.float64).mean(axis=1), rtol=1e-6,
                               atol=1e-7)


def test_masked_reduction_excludes_masked_elements(target):
    """nl.max / nl.sum with a free-dim mask reduce only the kept columns."""
    a = exact((128, 64), seed=37)
    a[:, 40:] = 1000.0  # would dominate max / sum if included

    def kernel(a_in):
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        x = nl.load(a_in[ip, jf])
        mx = nl.max(x[ip, jf], axis=[1], keepdims=True, mask=(jf < 40))
        sm = nl.sum(x[ip, jf], axis=[1], keepdims=True, mask=(jf < 40))
        return store_new(mx), store_new(sm)

    mx, sm = run(kernel, target, a)
    assert_exact(mx, a[:, :40].max(axis=1, keepdims=True))
    assert_exact(sm, a[:, :40].sum(axis=1, keepdims=True))


def test_masked_reduction_partition_mask(target):
    """nl.max / nl.sum with mask=(ip < rows) on a partly filled tile."""
    a = exact((72, 64), seed=38)

    def kernel(a_in):
        rows = a_in.shape[0]
        out = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(64)[None, :]
        m = ip < rows
        t = nl.load(a_in[ip, jf], mask=m)
        mx = nl.max(t, axis=[1], keepdims=True, mask=m)
        sm = nl.sum(t, axis=[1], keepdims=True, mask=m)
        nl.store(out[ip, nl.arange(1)[None, :]], value=mx, mask=m)
        nl.store(out[ip, 1 + nl.arange(1)[None, :]], value=sm, mask=m)
        return out

    out = run(kernel, target, a)
    assert_exact(out, np.stack([a.max(axis=1), a.sum(axis=1)], axis=1))


def test_transpose_and_matmul_transpose_x_false(target):
    x = ints((64, 128), seed=38)
    y = ints((128, 256), seed=39)

    def kernel(x_in, y_in):
        xs, ys = nl.load(x_in), nl.load(y_in)
        xt = nl.transpose(xs)
        assert xt.shape == (128, 64)
        ps = nl.matmul(xs, ys, transpose_x=False)
        ps2 = nl.matmul(x=nl.copy(xt), y=ys, transpose_x=True)
        return store_new(nl.copy(xt)), store_new(nl.copy(ps)), store_new(nl.copy(ps2))

    xt, p1, p2 = run(kernel, target, x, y)
    assert_exact(xt, x.T.copy())
    assert_exact(p1, x @ y)
    assert_exact(p2, x @ y)


def test_where(target):
    a = exact((128, 64), seed=40)
    b = exact((128, 64), seed=41)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        c = nl.greater(x, y)
        return (store_new(nl.where(c, x, y)), store_new(nl.where(c, x, 0.0)),
                store_new(nl.where(x < y, x, -1.0, dtype=nl.float16)))

    w1, w2, w3 = run(kernel, target, a, b)
    assert_exact(w1, np.where(a > b, a, b))
    assert_exact(w2, np.where(a > b, a, np.float32(0)))
    assert_exact(w3, np.where(a < b, a, np.float32(-1)).astype(np.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_load_transpose2d(target, dtype):
    a = exact((64, 128), seed=42, dtype=dtype)

    def kernel(a_in):
        t = nl.load_transpose2d(a_in)
        t32 = nl.load_transpose2d(a_in, dtype=nl.float32) * 2.0
        assert t.shape == (128, 64)
        return store_new(t), store_new(t32)

    t, t32 = run(kernel, target, a)
    assert_exact(t, a.T.copy())
    assert_exact(t32, a.T.astype(np.float32) * 2)


def test_zeros_ones_full_buffers(target):
    def kernel():
        z = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        o = nl.ones((128, 64), dtype=nl.float16, buffer=nl.sbuf)
        f = nl.full((128, 64), 2.5, dtype=nl.float32, buffer=nl.sbuf)
        fp = nl.full((128, 32), -3.0, dtype=nl.float32, buffer=nl.psum)
        fi = nl.full((16, 8), 7, dtype=nl.int32)
        return (store_new(nl.copy(z)), store_new(o), store_new(f), store_new(nl.copy(fp)), store_new(fi))

    z, o, f, fp, fi = run(kernel, target)
    assert_exact(z, np.zeros((128, 64), np.float32))
    assert_exact(o, np.ones((128, 64), np.float16))
    assert_exact(f, np.full((128, 64), 2.5, np.float32))
    assert_exact(fp, np.full((128, 32), -3.0, np.float32))
    assert_exact(fi, np.full((16, 8), 7, np.int32))


def test_loop_reduce_into_sbuf(target):
    """dst[...] = nl.loop_reduce(x, op=np.add, loop_indices=[k]) accumulates
    x into dst across the loop (documented: dst is also op's rhs input)."""
    a = exact((4, 128, 32), seed=43)

    def kernel(a_in):
        acc = nl.zeros((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        mx = nl.full((128, 32), -1e30, dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(a_in.shape[0] // 128):
            x = nl.load(a_in[k * 128:(k + 1) * 128, :])
            acc[...] = nl.loop_reduce(x, op=np.add, loop_indices=[k], dtype=nl.float32)
            mx[...] = nl.loop_reduce(x, op=np.max, loop_indices=[k])
        return store_new(acc), store_new(mx)

    acc, mx = run(kernel, target, a.reshape(4 * 128, 32))
    assert_exact(acc, a.sum(axis=0))
    assert_exact(mx, a.max(axis=0))


@pytest.mark.parametrize("rows", [256, 200])
def test_softmax_tutorial_masked(target, rows):
    """The softmax tutorial: masked rows, nl.max(keepdims), nl.subtract,
    nl.exp, nl.sum without keepdims, (P, N) / (P,) and a masked store."""
    r = np.random.default_rng(44)
    a = r.standard_normal((rows, 64)).astype(np.float32)

    def kernel(a_tensor):
        num_rows, n = a_tensor.shape
        out = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:n]
        for i in nl.affine_range(math.ceil(num_rows / 128)):
            m = (i * 128 + ix < num_rows)
            a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=m)
            max_vals = nl.max(a_tile, axis=[1], keepdims=True, mask=m)
            shifted = nl.subtract(a_tile, max_vals, mask=m)
            numerator = nl.exp(shifted, mask=m)
            denominator = nl.sum(numerator, axis=[1], mask=m)
            sm = numerator / denominator
            nl.store(out[i * 128 + ix, iy], value=sm, mask=m)
        return out

    e = np.exp(a - a.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run(kernel, target, a), want, rtol=RTOL, atol=1e-7)


@needs_torch
@pytest.mark.parametrize("rows", [128, 2])
def test_softmax_torch_tensors(target, rows):
    """torch float32 tensors in, a torch tensor out; a [2, 5] input (the
    tutorial's torch driver) leaves only 2 of 128 partitions live."""
    x = torch.randn(rows, 5, generator=torch.Generator().manual_seed(45))

    def kernel(a_tensor):
        num_rows, n = a_tensor.shape
        out = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
        ix = nl.arange(128)[:, None]
        iy = nl.arange(n)[None, :]
        m = ix < num_rows
        t = nl.load(a_tensor[ix, iy], mask=m)
        e = nl.exp(nl.subtract(t, nl.max(t, axis=[1], keepdims=True, mask=m), mask=m), mask=m)
        nl.store(out[ix, iy], value=nl.divide(e, nl.sum(e, axis=[1], mask=m), mask=m), mask=m)
        return out

    out = run(kernel, target, x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (rows, 5)
    torch.testing.assert_close(out, torch.softmax(x, dim=1), rtol=RTOL, atol=1e-7)


def rmsnorm_kernel(a_tensor, g_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    num_rows, n = a_tensor.shape
    ix, iw, iy = nl.mgrid[0:128, 0:1, 0:n]
    g_tile = nl.load(g_tensor.reshape((1, n))[iw, iy])
    for i in nl.affine_range(math.ceil(num_rows / 128)):
        m = (i * 128 + ix < num_rows)
        a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=m)
        sq = nl.square(a_tile, mask=m)
        sq_sum = nl.sum(sq, axis=[1], mask=m)
        mean = sq_sum / n
        rms_reciprocal = nl.rsqrt(mean, mask=m)
        out_tile = nl.multiply(a_tile, rms_reciprocal, mask=m)
        g_bcast = g_tile.broadcast_to((128, n))
        out_tile[...] = nl.multiply(out_tile, g_bcast, mask=m)
        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=m)
    return out_tensor


@pytest.mark.parametrize("rows", [256, 200])
def test_rmsnorm_tutorial(target, rows):
    r = np.random.default_rng(46)
    a = r.standard_normal((rows, 128)).astype(np.float32)
    g = r.standard_normal((128,)).astype(np.float32)
    want = a / np.sqrt(np.mean(a.astype(np.float64) ** 2, axis=1, keepdims=True)) * g
    np.testing.assert_allclose(run(rmsnorm_kernel, target, a, g), want, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("rows", [128, 150])
def test_layernorm_tutorial(target, rows):
    """layernorm v1: a 3-D mgrid whose third axis is the gamma partition
    index, nl.mean without keepdims, var = mean(x^2) - mean^2,
    (x - mean) * rsqrt(var + eps) * gamma + beta."""
    r = np.random.default_rng(47)
    x = r.standard_normal((rows, 64)).astype(np.float32)
    gamma = r.standard_normal((64,)).astype(np.float32)
    beta = r.standard_normal((64,)).astype(np.float32)

    def kernel(input_tensor, epsilon, gamma_vector, beta_vector):
        out = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)
        num_rows, n = input_tensor.shape
        i_p_io, i_f_io, i_p_param = nl.mgrid[0:nl.tile_size.pmax, 0:n, 0:1]
        g_tile = nl.load(gamma_vector.reshape((1, n))[i_p_param, i_f_io])
        b_tile = nl.load(beta_vector.reshape((1, n))[i_p_param, i_f_io])
        for i in nl.affine_range(math.ceil(num_rows / nl.tile_size.pmax)):
            m = (i * nl.tile_size.pmax + i_p_io < num_rows)
            t = nl.load(input_tensor[i * nl.tile_size.pmax + i_p_io, i_f_io], mask=m)
            mean = nl.mean(t, axis=1, mask=m)
            var = nl.mean(nl.square(t, mask=m), axis=1, mask=m) - mean * mean
            shifted = (t - mean) * nl.rsqrt(var + epsilon)
            res = shifted * g_tile.broadcast_to((nl.tile_size.pmax, n)) + \
                b_tile.broadcast_to((nl.tile_size.pmax, n))
            nl.store(out[i * nl.tile_size.pmax + i_p_io, i_f_io], value=res, mask=m)
        return out

    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    var = x64.var(axis=1, keepdims=True)
    want = (x64 - mu) / np.sqrt(var + 1e-5) * gamma + beta
    np.testing.assert_allclose(run(kernel, target, x, 1e-5, gamma, beta), want, rtol=1e-4, atol=1e-4)


def test_all_reduce_over_a_grid_axis(target):
    """nl.all_reduce: the programs along one launch-grid axis sum their tiles; each gets the sum."""
    rows = 2 if target != "trn1" else 1  # trn1 has two cores: one program each
    x = exact((rows, 2, 128, 16), seed=95)

    def kernel(x_in):
        i, j = nl.program_id(0), nl.program_id(1)
        total = nl.all_reduce(nl.load(x_in[i, j]), op=np.add, program_axes=1)
        out = nl.ndarray(x_in.shape, dtype=x_in.dtype, buffer=nl.shared_hbm)
        nl.store(out[i, j], total)
        return out

    got = run(kernel, target, x, grid=(rows, 2))
    assert_exact(got, np.broadcast_to(x.sum(axis=1, keepdims=True), x.shape))
    if target == "trn1":
        with pytest.raises(NotImplementedError, match="programs sharing a core"):
            run(kernel, target, exact((2, 2, 128, 16), seed=95), grid=(2, 2))
