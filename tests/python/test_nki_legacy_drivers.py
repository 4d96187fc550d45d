"""Legacy NKI: entry points (jit, baremetal, simulate_kernel, benchmark),
outputs passed in, torch tensors; cases that once crashed the simulator run
in a fresh interpreter."""
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
from test_nki_legacy_indexing import add_arange_kernel, add_mgrid_kernel, avgpool_kernel  # noqa: E402
from test_nki_legacy_isa import matmul_basic_kernel, matmul_tiled_kernel  # noqa: E402


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
