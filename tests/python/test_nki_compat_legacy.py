"""Compatibility suite for the legacy NKI generation served by tern
(`import neuronxcc.nki as nki` after `tern.nki.install()`).

Every kernel here is written for this file, in the style of the public NKI
tutorials (SPMD tensor add, softmax, rmsnorm, layernorm, tiled matmuls,
transpose2d, pooling, attention pieces), and checked against numpy/torch:
bit-exact where the arithmetic is exact (copies, adds of exactly
representable values, matmuls of small integers in fp32, max/min reductions,
transposes, casts of representable values), else within a stated tolerance
(transcendentals: exp / rsqrt / sqrt / reciprocal, rtol 1e-5 unless noted).

Each test runs on trn1, trn2 and trn3 (platform_target=, or
NEURON_PLATFORM_TARGET_OVERRIDE for the legacy entry points that take no
target argument).

Constructs tern gets wrong are strict xfails naming the bug (reason="tern
bug: ..."); the two that crash the simulator process run in a fresh
interpreter (section 6)."""
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

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency here
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

TARGETS = ("trn1", "trn2", "trn3")
RTOL = 1e-5  # transcendental functions (Scalar-engine activation tables)

@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


@pytest.fixture(params=TARGETS)
def env_target(request, monkeypatch):
    """The target chosen the legacy way: NEURON_PLATFORM_TARGET_OVERRIDE."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", request.param)
    return request.param


def run(kernel, target, *args, grid=None, **kwargs):
    k = nki.jit(kernel, platform_target=target)
    if grid is not None:
        k = k[grid]
    return k(*args, **kwargs)


def exact(shape, lo=-64, hi=64, denom=8.0, dtype=np.float32, seed=0):
    """Values k/denom for small integers k: every sum / product of a few of
    them is exact in fp32 (and fp16 / bf16 hold them exactly)."""
    r = np.random.default_rng(seed)
    return (r.integers(lo, hi, size=shape) / denom).astype(dtype)


def ints(shape, lo=-8, hi=9, seed=0):
    r = np.random.default_rng(seed)
    return r.integers(lo, hi, size=shape).astype(np.float32)


def pow2(shape, seed=0):
    """Nonzero powers of two (+-1/4 .. +-8): divisions by them are exact."""
    r = np.random.default_rng(seed)
    e = r.integers(-2, 4, size=shape)
    s = r.choice([-1.0, 1.0], size=shape)
    return (s * np.exp2(e)).astype(np.float32)


def assert_exact(got, want):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def hbm_like(t):
    """A shared-HBM output with the tile's shape and dtype."""
    return nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)


def store_new(t):
    out = hbm_like(t)
    nl.store(out, value=t)
    return out


# =====================================================================
# 1. Index expressions, par_dim, masks
# =====================================================================
def add_arange_kernel(a_input, b_input):
    """The SPMD tensor-add tutorial shape: nl.arange offsets by program id."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    off_x = nl.program_id(0) * 128
    off_y = nl.program_id(1) * 256
    ix = off_x + nl.arange(128)[:, None]
    iy = off_y + nl.arange(256)[None, :]
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])
    nl.store(c_output[ix, iy], value=a_tile + b_tile)
    return c_output


def add_mgrid_kernel(a_input, b_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    ix_, iy_ = nl.mgrid[0:128, 0:256]
    ix = nl.program_id(axis=0) * 128 + ix_
    iy = nl.program_id(axis=1) * 256 + iy_
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])
    nl.store(c_output[ix, iy], value=nl.add(a_tile, b_tile))
    return c_output


@pytest.mark.parametrize("kernel", [add_arange_kernel, add_mgrid_kernel], ids=["arange", "mgrid"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_spmd_add_index_exprs(target, kernel, dtype):
    a = exact((256, 512), dtype=dtype, seed=1)
    b = exact((256, 512), dtype=dtype, seed=2)
    out = run(kernel, target, a, b, grid=(2, 2))
    assert_exact(out, a + b)


def test_spmd_grid_each_program_writes_its_block(target):
    """With a 2x1 grid only the first column block is written: the grid
    really partitions the work (a wrong program_id would cover it all)."""
    a = exact((256, 512), seed=3)
    b = exact((256, 512), seed=4)
    out = np.full((256, 512), 99.0, np.float32)

    def kernel(a_input, b_input, c_output):
        ix = nl.program_id(0) * 128 + nl.arange(128)[:, None]
        iy = nl.program_id(1) * 256 + nl.arange(256)[None, :]
        nl.store(c_output[ix, iy], value=nl.load(a_input[ix, iy]) - nl.load(b_input[ix, iy]))

    assert run(kernel, target, a, b, out, grid=(2, 1)) is None
    assert_exact(out[:, :256], a[:, :256] - b[:, :256])
    assert np.all(out[:, 256:] == 99.0)


def grid_probe_kernel():
    """Each program writes (program_id(0), program_id(last), num_programs(0),
    num_programs(), program_ndim()) into its own row."""
    nd = nl.program_ndim()
    total = nl.num_programs()
    out = nl.ndarray((total, 5), dtype=nl.float32, buffer=nl.shared_hbm)
    ids = [nl.program_id(a) for a in range(nd)] or [0]
    extents = [nl.num_programs(a) for a in range(nd)] or [1]
    row = 0
    for i, n in zip(ids, extents):
        row = row * n + i
    vals = [ids[0], ids[-1], extents[0], total, nd]
    for c, v in enumerate(vals):
        nl.store(out[row:row + 1, c:c + 1], value=nl.full((1, 1), float(v), dtype=nl.float32))
    return out


@pytest.mark.parametrize("grid,extents", [
    ((2, 2), (2, 2)),
    ((3,), (3,)),
    (2, (2,)),
    ("nc2", (2,)),
    ("spmd", (4,)),
])
def test_program_id_num_programs(target, grid, extents):
    if grid == "nc2":
        grid = nl.nc(2)
    elif grid == "spmd":
        grid = nl.spmd_dim(nl.nc(2), 2)
    out = run(grid_probe_kernel, target, grid=grid)
    total = math.prod(extents)
    assert out.shape == (total, 5)
    for row, idx in enumerate(np.ndindex(*extents)):
        assert list(out[row]) == [idx[0], idx[-1], extents[0], total, len(extents)], (row, out[row])


def test_program_ndim_without_grid(target):
    out = run(grid_probe_kernel, target)
    assert out.tolist() == [[0.0, 0.0, 1.0, 1.0, 0.0]]


def test_par_dim_block_tiles(target):
    """(n, nl.par_dim(128), F) SBUF buffers indexed per block t[i]; a 4-D
    buffer with two block dims; nl.zeros with a par_dim shape."""
    a = exact((3 * 128, 64), seed=5)

    def kernel(a_in):
        n = a_in.shape[0] // 128
        out = nl.ndarray((128, n * 64), dtype=a_in.dtype, buffer=nl.shared_hbm)
        tiles = nl.ndarray((n, nl.par_dim(128), 64), dtype=a_in.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(0, n):
            tiles[i] = nl.load(a_in[i * 128:(i + 1) * 128, :])
        acc = nl.zeros((2, n, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(n):
            acc[1, i] = nl.multiply(tiles[i], 2.0)
            acc[1, i, :, 0:32] += tiles[i][:, 0:32]
        for i in nl.affine_range(n):
            nl.store(out[:, i * 64:(i + 1) * 64], value=acc[1, i])
        assert tiles.shape == (n, 128, 64) and tiles[0].shape == (128, 64)
        return out

    out = run(kernel, target, a)
    want = np.concatenate([a[i * 128:(i + 1) * 128] for i in range(3)], axis=1) * 2
    want[:, [c for i in range(3) for c in range(i * 64, i * 64 + 32)]] *= 1.5
    assert_exact(out, want.astype(np.float32))


def test_mgrid_attribute_access(target):
    """i = nl.mgrid[0:P, 0:F] used as i.p / i.x (the hoisted-load matmul
    tutorial)."""
    a = exact((128, 64), seed=6)

    def kernel(a_in):
        out = nl.ndarray(a_in.shape, dtype=a_in.dtype, buffer=nl.shared_hbm)
        i = nl.mgrid[0:128, 0:64]
        t = nl.load(a_in[i.p, i.x])
        nl.store(out[i.p, i.x], value=t)
        return out

    assert_exact(run(kernel, target, a), a)


def test_mgrid_3d_size1_axis_indexes_2d_tensors(target):
    """ix, iw, iy = nl.mgrid[0:128, 0:1, 0:N] (rmsnorm tutorial): iw is the
    partition index of a (1, N) view, ix/iy index (R, N) tensors."""
    a = exact((128, 96), seed=7)
    g = exact((96,), seed=8)

    def kernel(a_in, g_in):
        n = a_in.shape[1]
        out = nl.ndarray(a_in.shape, dtype=a_in.dtype, buffer=nl.shared_hbm)
        ix, iw, iy = nl.mgrid[0:128, 0:1, 0:n]
        g_tile = nl.load(g_in.reshape((1, n))[iw, iy])
        a_tile = nl.load(a_in[ix, iy])
        assert g_tile.shape == (1, n) and a_tile.shape == (128, n)
        nl.store(out[ix, iy], value=a_tile + g_tile.broadcast_to((128, n)))
        return out

    assert_exact(run(kernel, target, a, g), a + g[None, :])


def test_transpose2d_combined_free_index(target):
    """out[i_p, i_f2*F1 + i_f1] = copy(in[i_p, i_f1*F2 + i_f2]) from a 3-D
    mgrid (transpose2d tutorial), int8 data, shape2D as positional / kw."""
    r = np.random.default_rng(9)
    a = r.integers(-128, 128, size=(5, 12)).astype(np.int8)

    def kernel(in_tensor, shape2D):
        sz_p, _ = in_tensor.shape
        f1, f2 = shape2D
        out = nl.ndarray((sz_p, f1 * f2), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        in_tile = nl.load(in_tensor)
        out_tile = nl.ndarray(shape=(sz_p, f1 * f2), dtype=out.dtype)
        i_p0, i_f1, i_f2 = nl.mgrid[0:sz_p, 0:f1, 0:f2]
        out_tile[i_p0, i_f2 * f1 + i_f1] = nl.copy(in_tile[i_p0, i_f1 * f2 + i_f2])
        nl.store(out, value=out_tile)
        return out

    want = a.reshape(5, 3, 4).transpose(0, 2, 1).reshape(5, 12)
    assert_exact(run(kernel, target, a, (3, 4)), want)
    assert_exact(run(kernel, target, a, shape2D=(4, 3)), a.reshape(5, 4, 3).transpose(0, 2, 1).reshape(5, 12))


def avgpool_kernel(in_tensor, out_tensor, pool_size):
    """The pre-release avg-pool tutorial form: no return, output argument,
    5-D nl.arange window indices, nl.sum over axes [2, 4]."""
    sz_p, sz_hin, sz_win = in_tensor.shape
    sz_hout, sz_wout = sz_hin // pool_size, sz_win // pool_size
    in_tile = nl.ndarray((sz_p, sz_hin, sz_win), dtype=in_tensor.dtype, buffer=nl.sbuf)
    i_p = nl.arange(sz_p)[:, None, None]
    i_h = nl.arange(sz_hin)[None, :, None]
    i_w = nl.arange(sz_win)[None, None, :]
    in_tile[:, :, :] = nl.load(in_tensor[i_p, i_h, i_w])
    i_0 = nl.arange(sz_p)[:, None, None, None, None]
    i_1 = nl.arange(sz_hout)[None, :, None, None, None]
    i_2 = nl.arange(pool_size)[None, None, :, None, None]
    i_3 = nl.arange(sz_wout)[None, None, None, :, None]
    i_4 = nl.arange(pool_size)[None, None, None, None, :]
    window = in_tile[i_0, pool_size * i_1 + i_2, pool_size * i_3 + i_4]
    assert window.shape == (sz_p, sz_hout, pool_size, sz_wout, pool_size)
    out_tile = nl.sum(window, axis=[2, 4]) / (pool_size * pool_size)
    nl.store(out_tensor, value=out_tile)


def test_avgpool_5d_arange_baremetal_output_argument(env_target):
    x = exact((4, 8, 8), seed=10)
    out = np.zeros((4, 4, 4), np.float32)
    assert nki.baremetal(avgpool_kernel)(x, out, 2) is None
    want = x.reshape(4, 4, 2, 4, 2).sum(axis=(2, 4)) / 4
    assert_exact(out, want.astype(np.float32))


def masked_rows_kernel(a_in):
    """Rows that are not a multiple of 128: i*128 + ip < n masks on load,
    compute and store."""
    rows, cols = a_in.shape
    out = nl.ndarray(a_in.shape, dtype=a_in.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(cols)[None, :]
    for i in nl.affine_range(math.ceil(rows / 128)):
        m = (i * 128 + ip < rows)
        t = nl.load(a_in[i * 128 + ip, jf], mask=m)
        r = nl.multiply(t, 3.0, mask=m)
        nl.store(out[i * 128 + ip, jf], value=r, mask=m)
    return out


@pytest.mark.parametrize("rows", [1, 2, 100, 200, 256])
def test_partition_mask_rows(target, rows):
    a = exact((rows, 48), seed=rows)
    assert_exact(run(masked_rows_kernel, target, a), a * 3)


def test_mask_and_of_two_conditions(target):
    """mask=(i*P + ip < R) & (j*F + jf < C) over a 2-D tiling of a tensor
    whose shape is a multiple of neither tile dim."""
    a = exact((200, 300), seed=11)

    def kernel(a_in):
        R, C = a_in.shape
        out = nl.ndarray(a_in.shape, dtype=a_in.dtype, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(256)[None, :]
        for i in nl.affine_range(math.ceil(R / 128)):
            for j in nl.affine_range(math.ceil(C / 256)):
                m = (i * 128 + ip < R) & (j * 256 + jf < C)
                t = nl.load(a_in[i * 128 + ip, j * 256 + jf], mask=m)
                r = nl.add(t, 0.5, mask=m)
                nl.store(out[i * 128 + ip, j * 256 + jf], value=r, mask=m)
        return out

    assert_exact(run(kernel, target, a), a + 0.5)


def _store_window_kernel(lo, hi):
    def kernel(a_in, o):
        ip = nl.arange(128)[:, None]
        jf = nl.arange(32)[None, :]
        t = nl.load(a_in[ip, jf])
        nl.store(o[ip, jf], value=t, mask=(ip >= lo) & (ip < hi) & (jf < 20))
    return kernel


def _check_store_window(target, lo, hi):
    a = exact((128, 32), seed=12)
    out = np.full((128, 32), -1.0, np.float32)
    run(_store_window_kernel(lo, hi), target, a, out)
    want = np.full((128, 32), -1.0, np.float32)
    want[lo:hi, :20] = a[lo:hi, :20]
    assert_exact(out, want)


def test_mask_lower_and_upper_bound_store(target):
    """(ip >= 32) & (ip < 64) & (jf < 20) on a store: only that window
    changes."""
    _check_store_window(target, 32, 64)


def test_mask_store_window_unaligned_partition(target):
    """(ip >= 16) & (ip < 40): a DMA may start at any partition."""
    _check_store_window(target, 16, 40)


def test_python_bool_masks(target):
    """mask=False skips the instruction, True / None are no mask; masks from
    loop variables (k == 1) select iterations."""
    a = exact((3 * 128, 16), seed=13)
    skip = np.full((128, 16), 7.0, np.float32)
    keep = np.full((128, 16), 7.0, np.float32)
    sel = np.full((3 * 128, 16), 7.0, np.float32)

    def kernel(a_in, o_skip, o_keep, o_sel):
        t = nl.load(a_in[0:128, :])
        nl.store(o_skip, value=nl.add(t, 1.0), mask=False)
        r = nl.add(t, 1.0, mask=True)
        r2 = nl.multiply(r, 2.0, mask=None)
        nl.store(o_keep, value=r2, mask=True)
        for k in nl.affine_range(3):
            x = nl.load(a_in[k * 128:(k + 1) * 128, :], mask=(k != 0))
            nl.store(o_sel[k * 128:(k + 1) * 128, :], value=x, mask=(k == 1))

    run(kernel, target, a, skip, keep, sel)
    assert np.all(skip == 7.0)
    assert_exact(keep, (a[:128] + 1) * 2)
    assert np.all(sel[:128] == 7.0) and np.all(sel[256:] == 7.0)
    assert_exact(sel[128:256], a[128:256])


def test_mask_two_index_condition_maxpool_padding(target):
    """MaxPool2D with padding: window indices can be negative / past the
    edge; the mask relates the output and window indices."""
    x = exact((2, 6, 6), seed=14)

    def kernel(in_tensor, k, pad):
        sz_p, sz_hin, sz_win = in_tensor.shape
        ho, wo = sz_hin + 2 * pad - k + 1, sz_win + 2 * pad - k + 1
        out = nl.ndarray((sz_p, ho, wo), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
        in_tile = nl.load(in_tensor)
        i0, i1, i2, i3, i4 = nl.mgrid[0:sz_p, 0:ho, 0:wo, 0:k, 0:k]
        m = (i1 - pad + i3 >= 0) & (i1 - pad + i3 < sz_hin) & (i2 - pad + i4 >= 0) & (i2 - pad + i4 < sz_win)
        r = nl.max(in_tile[i0, i1 - pad + i3, i2 - pad + i4], axis=[3, 4], mask=m)
        nl.store(out, value=r)
        return out

    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.max(np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2)), axis=(3, 4))
    assert_exact(run(kernel, target, x, 3, 1), want.astype(np.float32))


# =====================================================================
# 2. Tile arithmetic
# =====================================================================
def test_tile_operators(target):
    a = exact((128, 64), seed=20)
    b = pow2((128, 64), seed=21)

    def kernel(a_in, b_in):
        x = nl.load(a_in)
        y = nl.load(b_in)
        res = [x + y, x - y, x * y, x / y, 3.0 * x, x * 0.25, 1.0 / y, -x, x - 1.5, 2.0 - x, x + 0.125]
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        t[...] = x * 2.0 + y
        res.append(t)
        acc = nl.zeros(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        acc[...] += x
        acc[...] += y
        acc += x
        res.append(acc)
        part = nl.zeros(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        part[:, 0:16] = x[:, 0:16]
        part[0:64, 16:32] = y[0:64, 16:32]
        res.append(part)
        return tuple(store_new(r) for r in res)

    outs = run(kernel, target, a, b)
    part = np.zeros_like(a)
    part[:, :16] = a[:, :16]
    part[:64, 16:32] = b[:64, 16:32]
    wants = [a + b, a - b, a * b, a / b, 3 * a, a * 0.25, 1 / b, -a, a - 1.5, 2 - a, a + 0.125,
             a * 2 + b, a + b + a, part]
    assert len(outs) == len(wants)
    for i, (o, w) in enumerate(zip(outs, wants)):
        assert_exact(o, w.astype(np.float32))


def test_tile_divide_general_values(target):
    """a / b and 1.0 / t for values that are not powers of two (rtol 1e-6)."""
    r = np.random.default_rng(22)
    a = r.uniform(-4, 4, (128, 64)).astype(np.float32)
    b = r.uniform(0.5, 4, (128, 64)).astype(np.float32)

    def kernel(a_in, b_in):
        x, y = nl.load(a_in), nl.load(b_in)
        return store_new(x / y), store_new(1.0 / y), store_new(nl.divide(x, y))

    q, rec, q2 = run(kernel, target, a, b)
    np.testing.assert_allclose(q, a / b, rtol=1e-6)
    np.testing.assert_allclose(rec, 1 / b, rtol=1e-6)
    np.testing.assert_allclose(q2, a / b, rtol=1e-6)


def test_partition_broadcast_of_reduced_tiles(target):
    """[P] / [P, 1] reduction results against [P, F]: x - max(x) (no
    keepdims), x * sum(keepdims), nl.subtract(x, nl.mean(x, axis=1)),
    x / sum without keepdims (softmax shape)."""
    a = exact((128, 64), seed=23)
    s = np.abs(pow2((128, 1), seed=24))

    def kernel(a_in, s_in):
        x = nl.load(a_in)
        sc = nl.load(s_in)
        mx = nl.max(x, axis=1)
        sm = nl.sum(x, axis=[1], keepdims=True)
        o1 = x - mx
        o2 = x * sm
        o3 = nl.subtract(x, nl.mean(x, axis=1))
        o4 = x / nl.max(nl.multiply(x, 0.0) + sc, axis=[1])
        o5 = nl.maximum(mx, x)
        return tuple(store_new(o) for o in (o1, o2, o3, o4, o5))

    o1, o2, o3, o4, o5 = run(kernel, target, a, s)
    assert_exact(o1, a - a.max(axis=1, keepdims=True))
    assert_exact(o2, a * a.sum(axis=1, keepdims=True))
    assert_exact(o3, a - a.mean(axis=1, keepdims=True, dtype=np.float32))
    assert_exact(o4, a / s)
    assert_exact(o5, np.broadcast_to(a.max(axis=1, keepdims=True), a.shape).astype(np.float32))


def test_broadcast_to_from_hbm_row_tile(target):
    """t.broadcast_to((128, F)) of a [1, F] tile loaded from HBM (rmsnorm's
    gamma)."""
    a = exact((128, 80), seed=25)
    g = exact((80,), seed=26)

    def kernel(a_in, g_in):
        n = g_in.shape[0]
        g_row = nl.load(g_in.reshape((1, n)))
        assert g_row.shape == (1, n)
        gb = g_row.broadcast_to((128, n))
        assert gb.shape == (128, n)
        x = nl.load(a_in)
        return store_new(x * gb), store_new(nl.copy(gb))

    o1, o2 = run(kernel, target, a, g)
    assert_exact(o1, a * g[None, :])
    assert_exact(o2, np.broadcast_to(g[None, :], (128, 80)).astype(np.float32))


def test_broadcast_to_from_computed_row_tile(target):
    """t.broadcast_to((128, F)) of a [1, F] tile computed on chip (the SD
    attention sample broadcasts (1.0 / sum) results)."""
    a = exact((128, 80), seed=27)
    g = exact((80,), seed=28)

    def kernel(a_in, g_in):
        n = g_in.shape[0]
        g2 = nl.add(nl.load(g_in.reshape((1, n))), 1.0)
        x = nl.load(a_in)
        return store_new(x - g2.broadcast_to((128, n)))

    assert_exact(run(kernel, target, a, g), a - (g[None, :] + 1))


def test_hbm_integer_index_tile_shape(target):
    """Integer indices on leading HBM dims are plain (the block index of a
    (n, 128, F) tensor, as attention kernels use q[b, h]): the value path."""
    a = exact((3, 128, 16), seed=29)

    def kernel(a_in):
        out = nl.ndarray((128, 16), dtype=a_in.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a_in[1]))
        return out

    assert_exact(run(kernel, target, a), a[1])


def test_hbm_integer_index_drops_dim(target):
    a = exact((3, 128, 16), seed=29)

    def kernel(a_in):
        assert a_in[1].shape == (128, 16), a_in[1].shape
        t = nl.load(a_in[2])
        assert t.shape == (128, 16), t.shape
        out = nl.ndarray((128, 16), dtype=a_in.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(t, nl.load(a_in[0])))
        return out

    assert_exact(run(kernel, target, a), a[2] + a[0])


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


# =====================================================================
# 5. Entry points and drivers
# =====================================================================
@nki.jit
def decorated_add(a_input, b_input):
    out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a_input) + nl.load(b_input))
    return out


def nc_version_kernel():
    out = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(out[0:1, 0:1], value=nl.full((1, 1), int(nisa.get_nc_version()), dtype=nl.int32))
    nl.store(out[0:1, 1:2], value=nl.full((1, 1), nl.tile_size.pmax, dtype=nl.int32))
    return out


NC_VERSION = {"trn1": 2, "trn2": 3, "trn3": 4}


def test_target_selection(env_target):
    """NEURON_PLATFORM_TARGET_OVERRIDE picks the chip for every entry point;
    platform_target= picks it for nki.jit."""
    want = NC_VERSION[env_target]
    assert nki.baremetal(nc_version_kernel)()[0, 0] == want
    assert nki.jit(nc_version_kernel)()[0, 0] == want
    assert nki.simulate_kernel(nki.baremetal(nc_version_kernel))[0, 0] == want
    other = {"trn1": "trn3", "trn2": "trn1", "trn3": "trn2"}[env_target]
    assert nki.jit(nc_version_kernel, platform_target=other)()[0, 0] == NC_VERSION[other]
    assert nki.jit(nc_version_kernel)()[0, 1] == 128


def test_jit_decorator(env_target):
    a = exact((128, 256), dtype=np.float16, seed=100)
    b = exact((128, 256), dtype=np.float16, seed=101)
    out = decorated_add(a, b)
    assert isinstance(out, np.ndarray)
    assert_exact(out, a + b)


def test_baremetal_forms(env_target):
    a = ints((128, 64), seed=102)
    b = ints((128, 512), seed=103)
    want = a.T @ b
    assert_exact(nki.baremetal(matmul_basic_kernel)(a, b), want)
    assert_exact(nki.baremetal(save_neff_name="file.neff", save_trace_name="profile.ntff")(matmul_basic_kernel)(a, b),
                 want)

    @nki.baremetal(save_neff_name="k.neff")
    def decorated(lhsT, rhs):
        return matmul_basic_kernel(lhsT, rhs)

    assert_exact(decorated(a, b), want)


def test_simulate_kernel_with_grid(env_target):
    a = exact((256, 512), seed=104)
    b = exact((256, 512), seed=105)
    assert_exact(nki.simulate_kernel(nki.baremetal(add_arange_kernel)[2, 2], a, b), a + b)
    assert_exact(nki.simulate_kernel(nki.jit(add_mgrid_kernel)[2, 2], a, b), a + b)
    x = exact((4, 8, 8), seed=106)
    out = np.zeros((4, 4, 4), np.float32)
    assert nki.simulate_kernel(nki.baremetal(avgpool_kernel), x, out, pool_size=2) is None
    assert_exact(out, (x.reshape(4, 4, 2, 4, 2).sum(axis=(2, 4)) / 4).astype(np.float32))


def test_benchmark_with_typing_specs(env_target):
    bench = nki.benchmark(warmup=5, iters=10)(matmul_tiled_kernel)
    bench(nt.tensor[[256, 256], nl.float32], nt.tensor[[256, 512], nl.float32])
    lat = bench.benchmark_result.nc_latency
    p50 = lat.get_latency_percentile(50)
    assert p50 > 0
    assert lat.get_latency_percentile(99) >= p50
    big = nki.benchmark(warmup=2, iters=3)(matmul_tiled_kernel)
    big(nt.tensor[[1024, 256], nl.float32], nt.tensor[[1024, 512], nl.float32])
    assert big.benchmark_result.nc_latency.get_latency_percentile(50) > p50
    # the layernorm / mamba samples' form: benchmark(fn, save_neff_name=..., save_trace_name=...)(args)
    kw = nki.benchmark(matmul_tiled_kernel, save_neff_name="file.neff", save_trace_name="profile.ntff")
    kw(nt.tensor[[256, 256], nl.float32], nt.tensor[[256, 512], nl.float32])
    assert kw.benchmark_result.nc_latency.get_latency_percentile(50) == p50


def test_benchmark_grid_and_arrays(env_target):
    """benchmark(...)(fn)[grid] with numpy inputs: a 2x2 grid does four
    times the work of a 1x1 launch (spread over cores where the chip has
    them), so it takes at least as long."""
    a = exact((256, 512), seed=107)
    one = nki.benchmark(warmup=1, iters=2)(add_arange_kernel)[1, 1]
    assert one.benchmark_result is None
    one(a, a)
    four = nki.benchmark(warmup=1, iters=2)(add_arange_kernel)[2, 2]
    four(a, a)
    p1 = one.benchmark_result.nc_latency.get_latency_percentile(50)
    p4 = four.benchmark_result.nc_latency.get_latency_percentile(50)
    assert 0 < p1 <= p4


@needs_torch
def test_output_arguments_numpy_and_torch(target):
    """Kernels that return nothing and fill outputs passed in (numpy arrays
    and torch tensors)."""
    a = exact((128, 64), seed=108)

    def kernel(a_in, out_a, out_b):
        t = nl.load(a_in)
        nl.store(out_a, value=nl.multiply(t, 2.0))
        nl.store(dst=out_b, value=nl.add(t, 1.0))

    oa = np.zeros((128, 64), np.float32)
    ob = np.zeros((128, 64), np.float16)
    assert run(kernel, target, a, oa, ob) is None
    assert_exact(oa, a * 2)
    assert_exact(ob, (a + 1).astype(np.float16))

    ta = torch.zeros(128, 64)
    tb = torch.zeros(128, 64, dtype=torch.float16)
    assert run(kernel, target, torch.from_numpy(a), ta, tb) is None
    assert torch.equal(ta, torch.from_numpy(a * 2))
    assert torch.equal(tb, torch.from_numpy((a + 1).astype(np.float16)))


@needs_torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_inputs(target, dtype):
    dtype = getattr(torch, dtype)
    a = torch.from_numpy(exact((256, 512), seed=109)).to(dtype)
    b = torch.from_numpy(exact((256, 512), seed=110)).to(dtype)
    out = run(add_arange_kernel, target, a, b, grid=(2, 2))
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == (256, 512)
    assert torch.equal(out, a + b)


def test_rotary_style_slices_and_helper(target):
    """A jit helper called from a kernel writing into an SBUF tile passed in,
    nl.ndarray([2] + [nl.par_dim(P), F]) buffers, half-slice arithmetic
    with -1 * t, and a store with a positional value."""
    r = np.random.default_rng(111)
    q = exact((128, 64), seed=112)
    cos = r.choice([0.5, 1.0, -1.0], size=(128, 32)).astype(np.float32)
    sin = r.choice([0.5, 0.25, -1.0], size=(128, 32)).astype(np.float32)

    @nki.jit
    def core(q_tile, cos_tile, sin_tile, out_tile):
        d = q_tile.shape[1]
        out_tile[0, :, :d // 2] = q_tile[:, :d // 2] * cos_tile + (-1 * q_tile[:, d // 2:] * sin_tile)
        out_tile[0, :, d // 2:] = q_tile[:, d // 2:] * cos_tile + q_tile[:, :d // 2] * sin_tile

    def kernel(q_in, c_in, s_in):
        out = nl.ndarray(q_in.shape, dtype=q_in.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray([2] + [nl.par_dim(128), q_in.shape[1]], dtype=q_in.dtype, buffer=nl.sbuf)
        core(nl.load(q_in), nl.load(c_in), nl.load(s_in), buf)
        nl.store(out, buf[0, :, :])
        return out

    h = 32
    want = np.concatenate([q[:, :h] * cos - q[:, h:] * sin, q[:, h:] * cos + q[:, :h] * sin], axis=1)
    assert_exact(run(kernel, target, q, cos, sin), want.astype(np.float32))


@needs_torch
def test_attention_pieces_sd_style(target):
    """The SD-attention building blocks: load_transpose2d(q) * scale,
    qk += nc_matmul, causal affine_select, tensor_reduce max negate,
    activation exp with bias, (1.0 / sum).broadcast_to, nc_transpose and a
    a store of the transposed result, checked against torch (float64)."""
    r = np.random.default_rng(113)
    seq, d = 128, 64
    q = r.standard_normal((seq, d)).astype(np.float32)
    k = r.standard_normal((seq, d)).astype(np.float32)
    v = r.standard_normal((seq, d)).astype(np.float32)
    scale = 0.125

    def kernel(q_ref, k_ref, v_ref):
        out_ref = nl.ndarray((d, seq), dtype=q_ref.dtype, buffer=nl.shared_hbm)  # transposed output
        q_t = nl.load_transpose2d(q_ref) * scale  # [d, seq]
        k_t = nl.load_transpose2d(k_ref)          # [d, seq]
        v_s = nl.load(v_ref)                       # [seq, d]
        qk = nl.zeros((seq, seq), dtype=nl.float32, buffer=nl.psum)
        qk += nisa.nc_matmul(stationary=q_t, moving=k_t)
        ip = nl.arange(seq)[:, None]
        jf = nl.arange(seq)[None, :]
        masked = nisa.affine_select(pred=(ip >= jf), on_true_tile=nl.copy(qk), on_false_value=-9984.0,
                                    dtype=nl.float32)
        neg_max = nisa.tensor_reduce(np.max, data=masked, axis=(1,), negate=True, keepdims=True)
        ex = nisa.activation(np.exp, data=masked, bias=neg_max, scale=1.0)
        sm = nl.sum(ex, axis=1, keepdims=True)
        ex_t = nisa.tensor_copy(nisa.nc_transpose(ex))     # [seq_k, seq_q]
        attn = nl.copy(nisa.nc_matmul(stationary=ex_t, moving=v_s))  # [seq_q, d]
        res = attn * (1.0 / sm).broadcast_to((seq, d))
        res_t = nisa.tensor_copy(nisa.nc_transpose(res))  # [d, seq]
        nl.store(out_ref, value=res_t)
        return out_ref

    got = run(kernel, target, q, k, v)
    s = torch.from_numpy(q).double() @ torch.from_numpy(k).double().T * scale
    s = s.masked_fill(torch.ones(seq, seq).tril() == 0, float("-inf"))
    want = (torch.softmax(s, dim=1) @ torch.from_numpy(v).double()).T.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# =====================================================================
# 6. Crashes: run in a fresh interpreter so an abort cannot take pytest down
# =====================================================================
_ISOLATED_PRELUDE = """
import numpy as np
import tern.nki
tern.nki.install()
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
"""


def run_isolated(body):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = _ISOLATED_PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("isolated_target", TARGETS)
def test_store_of_another_shape_copies_in_element_order_and_never_crashes(isolated_target):
    """A DMA moves as many elements as it reads (NKI: the counts must match,
    the shapes may differ): a (4, 3) tile stored into a (3, 4) tensor lands
    in row-major order; different counts are an error, never a crash."""
    proc = run_isolated(f"""
        def kernel(a):
            out = nl.ndarray((3, 4), dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.load(a))
            return out
        a = np.arange(12, dtype=np.float32).reshape(4, 3)
        got = nki.jit(kernel, platform_target="{isolated_target}")(a)
        print("SAME", bool(np.array_equal(got, a.reshape(3, 4))))
        def short(a):
            out = nl.ndarray((3, 3), dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.load(a))
            return out
        try:
            nki.jit(short, platform_target="{isolated_target}")(a)
        except Exception as e:
            print("RAISED", type(e).__name__)
    """)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert "SAME True" in proc.stdout
    assert "RAISED" in proc.stdout


@pytest.mark.parametrize("isolated_target", TARGETS)
def test_transposed_store_via_swapped_index_exprs(isolated_target):
    proc = run_isolated(f"""
        def kernel(a):
            P, F = a.shape
            out = nl.ndarray((F, P), dtype=a.dtype, buffer=nl.shared_hbm)
            ip = nl.arange(P)[:, None]
            jf = nl.arange(F)[None, :]
            nl.store(out[jf, ip], value=nl.load(a))
            return out
        a = (np.arange(128 * 64) % 97).astype(np.float32).reshape(128, 64)
        r = nki.jit(kernel, platform_target="{isolated_target}")(a)
        print("OK" if np.array_equal(r, a.T) else "WRONG")
    """)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert "OK" in proc.stdout
