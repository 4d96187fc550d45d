"""Current NKI API: the Scalar engine (activation functions, reduce
registers), selection / search / scan (with tensor_scalar_cumulative and
nl.softmax), MX matmul, and the nki.isa enums."""
import dataclasses
import math
import numpy as np
import pytest
import torch
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


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


def k_cumulative(x, op0, imm0, op1, start):
    t = load(x)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    if start is None:
        nisa.tensor_scalar_cumulative(dst=out, src=t, op0=op0, op1=op1, imm0=imm0)
    else:
        nisa.tensor_scalar_cumulative(dst=out, src=t, op0=op0, op1=op1, imm0=imm0, imm1=start,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
    return store(out)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("op1, start, accumulate", [
    (nl.add, None, np.cumsum), (nl.maximum, None, np.maximum.accumulate),
    (nl.add, 10.0, lambda a, axis: 10.0 + np.cumsum(a, axis=axis))])
def test_tensor_scalar_cumulative(target, op1, start, accumulate):
    x = ints_as_f32((P, 16), -8, 8, 263)
    got = run(k_cumulative, target, x, nl.multiply, 2.0, op1, start)
    assert np.array_equal(got, accumulate(x * 2, axis=1).astype(np.float32))


def k_cumulative_subtract(x):
    """op1=subtract: reg = y[i] - reg (the operand order of the ISA's pseudocode)."""
    t = load(x)
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=out, src=t, op0=nl.add, op1=nl.subtract, imm0=0.0)
    return store(out)


@pytest.mark.parametrize("target", V3)
def test_tensor_scalar_cumulative_subtract_order(target):
    x = ints_as_f32((P, 6), -8, 8, 264)
    want = np.zeros_like(x)
    reg = np.zeros(P, np.float32)
    for i in range(x.shape[1]):
        reg = x[:, i] - reg
        want[:, i] = reg
    assert np.array_equal(run(k_cumulative_subtract, target, x), want)


def k_softmax(x):
    return store(nl.softmax(load(x), axis=1))


@pytest.mark.parametrize("target", V3)
def test_language_softmax(target):
    x = normal((P, 96), 265)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run(k_softmax, target, x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def k_sequence_bounds(ids):
    out = nl.ndarray((1, 2, ids.shape[1]), nl.int32, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=out, segment_ids=load(ids))
    return store(out)


@pytest.mark.parametrize("target", V2)
def test_sequence_bounds(target):
    r = rng(266)
    ids = np.repeat(r.integers(0, 4, size=40), r.integers(1, 6, size=40))[None, :128].astype(np.int32)
    got = run(k_sequence_bounds, target, ids)
    assert np.array_equal(got, segment_runs(ids[0])[None].astype(np.int32))


def k_activate2(x, col):
    """Activation2: exp((x * col) - 0.5) with the row sums, and relu(2 - x) (reverse0)."""
    t, c = load(x), load(col)
    a = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    sums = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=a, op=nl.exp, data=t, imm0=c, imm1=0.5, op0=nl.multiply, op1=nl.subtract,
                   reduce_op=nl.add, reduce_res=sums, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    b = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=b, op=nl.relu, data=t, imm0=2.0, imm1=0.0, op0=nl.subtract, op1=nl.bypass, reverse0=True)
    return store(a), store(sums), store(b)


def test_activate2_on_trn3():
    x, col = normal((P, 32), 267), normal((P, 1), 268)
    a, sums, b = run(k_activate2, "trn3", x, col)
    pre = x * col - np.float32(0.5)
    np.testing.assert_allclose(a, np.exp(pre), rtol=2e-6)
    np.testing.assert_allclose(sums[:, 0], a.sum(axis=1), rtol=1e-5)
    assert np.array_equal(b, np.maximum(np.float32(2) - x, 0))
    with pytest.raises(ValueError, match="NeuronCore-v4"):
        run(k_activate2, "trn2", x, col)


def k_gather_flattened(data, idx):
    return store(nl.gather_flattened(load(data), load(idx)))


@pytest.mark.parametrize("target", V2)
def test_gather_flattened(target):
    data = normal((P, 4, 16), 269)
    idx = rng(270).integers(0, 64, size=(P, 2, 8)).astype(np.uint32)
    got = run(k_gather_flattened, target, data, idx)
    want = np.take_along_axis(data.reshape(P, -1), idx.reshape(P, -1).astype(np.int64), axis=1)
    assert np.array_equal(got, want.reshape(idx.shape))
