"""Current NKI API: kernel arguments and results (keywords, outputs passed in,
torch tensors, NKIObject configurations), loosely matched shapes, and the
two programs of an LNC=2 core."""
import dataclasses
import math
import numpy as np
import pytest
import torch
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403
from test_nki_current_scalar_select import distinct_rows  # noqa: E402
from test_nki_current_vector import k_cast, k_copy_predicated  # noqa: E402


# ================================================================ kernel arguments and results
@dataclasses.dataclass
class ScaleConfig(nl.NKIObject):
    scale: float = 2.0
    bias: float = 0.0
    tile_f: int = 32


@dataclasses.dataclass
class Section(nl.NKIObject):
    """attention-style configuration: plain class attributes, no annotations, under @dataclass."""
    index = None
    offset = 0
    tiles = []


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


@dataclasses.dataclass
class Tiling(nl.NKIObject):
    rows: int
    remainder: int  # declared, never passed (mlp_tkg's constants)


def test_dataclass_nkiobject_fields_left_out_are_none():
    t = Tiling(rows=4)
    assert (t.rows, t.remainder) == (4, None)


def test_dataclass_nkiobject_with_plain_attributes():
    s = Section(index=2, offset=128)
    assert (s.index, s.offset, s.tiles) == (2, 128, [])
    s.tiles.append(1)
    assert Section().tiles == [] and Section(3).index == 3


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


def k_sendrecv_reused_buffer(x):
    """Two messages into one receive buffer (mlp_tkg's gate then up partial sums); program 1 reads the
    first one late, so the second must wait for that read."""
    pid = nl.program_id(axis=0)
    out = nl.ndarray((2, 2 * P, 32), nl.float32, buffer=nl.shared_hbm)
    first, second, recv = (nl.ndarray((P, 32), nl.float32, buffer=nl.sbuf) for _ in range(3))
    nisa.dma_copy(dst=first, src=x[0, nl.ds(pid * P, P), :])
    nisa.dma_copy(dst=second, src=x[1, nl.ds(pid * P, P), :])
    nisa.sendrecv(src=first, dst=recv, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    busy = nl.ndarray((P, 2048), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=busy, value=0.0)
    for _ in range(8 * pid):  # keeps program 1 busy (microseconds) before it reads the first message
        nisa.activation(dst=busy, data=busy, op=nl.copy)
    got = nl.ndarray((P, 32), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=got, data1=recv, data2=busy[:, 0:32], op=nl.add)  # + 0, after the busy work
    nisa.dma_copy(dst=out[0, nl.ds(pid * P, P), :], src=got)
    nisa.sendrecv(src=second, dst=recv, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nisa.dma_copy(dst=out[1, nl.ds(pid * P, P), :], src=recv)
    return out


@pytest.mark.parametrize("target", V3)
def test_sendrecv_into_a_reused_buffer_waits_for_its_reads(target):
    x = normal((2, 2 * P, 32), 254)
    got = nki.jit(k_sendrecv_reused_buffer, platform_target=target)[2](x)
    swapped = np.concatenate([x[:, P:], x[:, :P]], axis=1)  # each program receives the other's rows
    assert np.array_equal(got, swapped)


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


def k_barrier_one_program(x):
    """A kernel written for LNC=2 (barrier over cores 0 and 1) launched as one program."""
    t = load(x)
    nisa.core_barrier(t, (0, 1))
    return store(t)


@pytest.mark.parametrize("target", V3)
def test_core_barrier_in_a_one_program_launch_waits_for_no_one(target):
    x = normal((P, 16), 253)
    assert np.array_equal(run(k_barrier_one_program, target, x), x)


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
