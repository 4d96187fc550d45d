"""Legacy NKI (neuronxcc.nki): index expressions, par_dim block tiles, masks
and tile arithmetic, in the style of the public tutorials, against numpy."""
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
