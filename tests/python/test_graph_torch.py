"""tern.graph against torch float64 autograd, op by op and on whole blocks.

For every forward op of the graph IR a small graph is built with tern.graph
(float64-valued params), a random input R of the op's output shape is
added, loss = sum(op(...) * R), the backward pass by add_backward, and the
float64 reference interpreter evaluates it. The same computation is written
in torch (float64) and differentiated by autograd. The op's output, the
loss and EVERY parameter gradient must agree to 1e-9 relative to the
largest magnitude of the compared tensors: max|tern - torch| <= 1e-9 *
max(max|tern|, max|torch|). A GPT-2-style and a Llama-style block (RMSNorm,
RoPE, SwiGLU, GQA) are checked the same way, their cross-entropy loss being
the objective. Also: the text form round trip from Python, and bad graphs
raising with messages that name the op and the values.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tern import _core
from tern import graph as tg

TOL = 1e-9


def randn(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def close(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    scale = max(np.abs(got).max(initial=0.0), np.abs(want).max(initial=0.0))
    err = np.abs(got - want).max(initial=0.0)
    assert err <= TOL * scale, f"{what}: max |tern - torch| = {err:.3g}, scale {scale:.3g}"


def check(build, ref, params, inputs=None, seed=0, weighted=True):
    """Builds y = build(g, P, I) (a Tensor, or a tuple whose first entry is
    differentiated and the rest compared forward only) and the same in torch,
    ref(P, I), on params {name: float64 array} and inputs {name: array;
    integer arrays become int32 ids}. weighted: loss = sum(y * R); else y is
    the (scalar) loss. Compares outputs, loss and every parameter gradient."""
    inputs = inputs or {}
    rng = np.random.default_rng(seed + 1000)
    g = tg.Graph("t")
    P = {n: g.param(n, a.shape, "fp32") for n, a in params.items()}
    inty = {n: np.issubdtype(np.asarray(a).dtype, np.integer) for n, a in inputs.items()}
    I = {n: g.input(n, np.shape(a), "int32" if inty[n] else "fp32") for n, a in inputs.items()}
    ys = build(g, P, I)
    ys = ys if isinstance(ys, tuple) else (ys,)
    feeds = {**params, **inputs}
    if weighted:
        r = rng.standard_normal(ys[0].shape)
        loss = g.sum(ys[0] * g.input("R", ys[0].shape, ys[0].dtype))
        feeds["R"] = r
    else:
        loss = ys[0]
    grads = g.backward(loss, list(P.values()))
    out = g.evaluate(feeds, [*ys, loss, *grads.values()])

    tp = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in params.items()}
    ti = {n: torch.tensor(np.asarray(a), dtype=torch.int64 if inty[n] else torch.float64)
          for n, a in inputs.items()}
    tys = ref(tp, ti)
    tys = tys if isinstance(tys, tuple) else (tys,)
    assert len(tys) == len(ys)
    tloss = (tys[0] * torch.tensor(r)).sum() if weighted else tys[0]
    tloss.backward()

    for i, (y, ty) in enumerate(zip(ys, tys)):
        close(out[y.name], ty, f"output {i} %{y.name}")
    close(out[loss.name], tloss, "loss")
    for n, t in tp.items():
        want = t.grad if t.grad is not None else torch.zeros_like(t)
        close(out[grads[n].name], want, f"d loss / d {n}")
    return g


def tr(t, flag):
    return t.transpose(-1, -2) if flag else t


# -- matmul ------------------------------------------------------------------

TRANS = [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("ta,tb", TRANS)
def test_matmul_2d(ta, tb):
    rng = np.random.default_rng(1)
    a = randn(rng, 4, 3) if ta else randn(rng, 3, 4)
    b = randn(rng, 5, 4) if tb else randn(rng, 4, 5)
    check(lambda g, P, I: g.matmul(P["a"], P["b"], bool(ta), bool(tb)),
          lambda P, I: tr(P["a"], ta) @ tr(P["b"], tb), {"a": a, "b": b})


@pytest.mark.parametrize("batch", [(2,), (2, 3)])
@pytest.mark.parametrize("tb", [0, 1])
def test_matmul_batched_activations_shared_weight(batch, tb):
    rng = np.random.default_rng(2)
    a = randn(rng, *batch, 3, 4)
    b = randn(rng, 5, 4) if tb else randn(rng, 4, 5)
    check(lambda g, P, I: g.matmul(P["a"], P["b"], False, bool(tb)),
          lambda P, I: P["a"] @ tr(P["b"], tb), {"a": a, "b": b})


@pytest.mark.parametrize("tb", [0, 1])
def test_matmul_transposed_batched_against_shared(tb):
    """trans_a with a batched a and a shared b: forward right, the gradient
    refused (add_backward documents it as not supported)."""
    rng = np.random.default_rng(3)
    av, bv = randn(rng, 2, 4, 3), (randn(rng, 5, 4) if tb else randn(rng, 4, 5))
    g = tg.Graph("t")
    a, b = g.param("a", av.shape), g.param("b", bv.shape)
    y = g.matmul(a, b, True, bool(tb))
    out = g.evaluate({"a": av, "b": bv}, [y])
    close(out[y.name], tr(torch.tensor(av), 1) @ tr(torch.tensor(bv), tb), "forward")
    with pytest.raises(NotImplementedError, match="transposed batched matmul"):
        g.backward(g.sum(y), [a, b])


@pytest.mark.parametrize("batch", [(2,), (2, 3)])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_matmul_batched_both(batch, ta, tb):
    rng = np.random.default_rng(4)
    a = randn(rng, *batch, 4, 3) if ta else randn(rng, *batch, 3, 4)
    b = randn(rng, *batch, 5, 4) if tb else randn(rng, *batch, 4, 5)
    check(lambda g, P, I: g.matmul(P["a"], P["b"], bool(ta), bool(tb)),
          lambda P, I: tr(P["a"], ta) @ tr(P["b"], tb), {"a": a, "b": b})


def test_matmul_operator():
    rng = np.random.default_rng(5)
    check(lambda g, P, I: P["a"] @ P["b"], lambda P, I: P["a"] @ P["b"],
          {"a": randn(rng, 2, 3, 4), "b": randn(rng, 4, 5)})


# -- elementwise ---------------------------------------------------------------

ELEMENTWISE = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
BROADCASTS = [((3, 4), (4,)), ((3, 4), (3, 1)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)),
              ((), (2, 3)), ((2, 3), (2, 3))]


@pytest.mark.parametrize("op", list(ELEMENTWISE))
@pytest.mark.parametrize("sa,sb", BROADCASTS)
def test_elementwise_broadcasting(op, sa, sb):
    rng = np.random.default_rng(6)
    f = ELEMENTWISE[op]
    check(lambda g, P, I: getattr(g, op)(P["a"], P["b"]), lambda P, I: f(P["a"], P["b"]),
          {"a": randn(rng, *sa), "b": randn(rng, *sb)})


def test_elementwise_operators_and_numbers():
    """+ - * and unary - on handles; a Python number becomes a constant
    (times a number: scale)."""
    rng = np.random.default_rng(7)

    def f(x, b):
        return (2.0 - x) * b + x * 3 + 1.5 - (-x) * 0.5 + 0.25 * x

    check(lambda g, P, I: f(P["x"], P["b"]), lambda P, I: f(P["x"], P["b"]),
          {"x": randn(rng, 3, 4), "b": randn(rng, 4)})


def test_scale():
    rng = np.random.default_rng(8)
    check(lambda g, P, I: g.scale(P["x"], -2.5), lambda P, I: P["x"] * -2.5,
          {"x": randn(rng, 3, 4)})


# -- activations ---------------------------------------------------------------

ACTS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


@pytest.mark.parametrize("func", list(ACTS))
def test_activation(func):
    rng = np.random.default_rng(9)
    x = randn(rng, 5, 7, scale=2.0)
    x[np.abs(x) < 1e-3] = 0.5  # relu's kink at 0
    check(lambda g, P, I: getattr(g, func)(P["x"]), lambda P, I: ACTS[func](P["x"]), {"x": x})
    check(lambda g, P, I: g.act(func, P["x"]), lambda P, I: ACTS[func](P["x"]), {"x": x})


def test_the_checks_can_fail():
    """The comparison is tight enough to tell gelu from its tanh form."""
    rng = np.random.default_rng(10)
    with pytest.raises(AssertionError, match="output 0"):
        check(lambda g, P, I: g.gelu(P["x"]), lambda P, I: ACTS["gelu_tanh"](P["x"]),
              {"x": randn(rng, 5, 7)})
    with pytest.raises(AssertionError, match="d loss / d b"):  # a gradient alone wrong
        check(lambda g, P, I: P["a"] @ P["b"],
              lambda P, I: P["a"] @ (P["b"] + (P["b"] - P["b"].detach()) * 1e-6),
              {"a": randn(rng, 3, 4), "b": randn(rng, 4, 5)})


# -- norms, softmax, cross-entropy -----------------------------------------------


def torch_rmsnorm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


@pytest.mark.parametrize("eps", [None, 1e-5, 0.1])
def test_rmsnorm(eps):
    rng = np.random.default_rng(11)
    kw = {} if eps is None else {"eps": eps}
    check(lambda g, P, I: g.rmsnorm(P["x"], P["gamma"], **kw),
          lambda P, I: torch_rmsnorm(P["x"], P["gamma"], 1e-6 if eps is None else eps),
          {"x": randn(rng, 2, 3, 8), "gamma": randn(rng, 8)})


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_layernorm(eps):
    rng = np.random.default_rng(12)
    kw = {} if eps is None else {"eps": eps}
    check(lambda g, P, I: g.layernorm(P["x"], P["gamma"], P["beta"], **kw),
          lambda P, I: F.layer_norm(P["x"], (8,), P["gamma"], P["beta"],
                                    1e-5 if eps is None else eps),
          {"x": randn(rng, 2, 3, 8), "gamma": randn(rng, 8), "beta": randn(rng, 8)})


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
def test_norms_by_op_name_default_eps(op):
    """add_op without an eps attribute: the op's default (rmsnorm 1e-6,
    layernorm 1e-5), backward included (small x so that eps matters)."""
    rng = np.random.default_rng(13)
    p = {"x": randn(rng, 3, 8, scale=1e-3), "gamma": randn(rng, 8)}
    if op == "rmsnorm":
        check(lambda g, P, I: g.op("rmsnorm", P["x"], P["gamma"]),
              lambda P, I: torch_rmsnorm(P["x"], P["gamma"], 1e-6), p)
    else:
        p["beta"] = randn(rng, 8)
        check(lambda g, P, I: g.op("layernorm", P["x"], P["gamma"], P["beta"]),
              lambda P, I: F.layer_norm(P["x"], (8,), P["gamma"], P["beta"], 1e-5), p)


def test_softmax():
    rng = np.random.default_rng(14)
    check(lambda g, P, I: g.softmax(P["x"]), lambda P, I: torch.softmax(P["x"], -1),
          {"x": randn(rng, 2, 3, 6, scale=2.0)})


@pytest.mark.parametrize("ignore_index", [-100, -1, 2])
def test_cross_entropy(ignore_index):
    """Mean over the tokens whose target != ignore_index (which may be a
    real class), as torch's F.cross_entropy."""
    rng = np.random.default_rng(15)
    t = np.array([[3, ignore_index, 0], [6, 2, ignore_index]], dtype=np.int32)
    check(lambda g, P, I: g.cross_entropy(P["logits"], I["t"], ignore_index),
          lambda P, I: F.cross_entropy(P["logits"].reshape(-1, 7), I["t"].reshape(-1),
                                       ignore_index=ignore_index),
          {"logits": randn(rng, 2, 3, 7, scale=2.0)}, {"t": t})


def test_cross_entropy_default_ignore_index():
    rng = np.random.default_rng(16)
    t = np.array([1, -100, 4, 0], dtype=np.int32)
    check(lambda g, P, I: g.cross_entropy(P["logits"], I["t"]),
          lambda P, I: F.cross_entropy(P["logits"], I["t"]), {"logits": randn(rng, 4, 5)},
          {"t": t})


# -- embedding, rope, attention ---------------------------------------------------


def test_embedding():
    rng = np.random.default_rng(17)
    ids = np.array([[1, 5, 1], [0, 1, 3]], dtype=np.int32)
    check(lambda g, P, I: g.embedding(P["table"], I["ids"]),
          lambda P, I: F.embedding(I["ids"], P["table"]), {"table": randn(rng, 6, 4)},
          {"ids": ids})


def rope_tables(S, D, base=10000.0):
    inv = base ** (-np.arange(D // 2) * 2.0 / D)
    ang = np.arange(S)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def torch_rope(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def test_rope():
    rng = np.random.default_rng(18)
    cos, sin = rope_tables(3, 6)
    check(lambda g, P, I: g.rope(P["x"], I["cos"], I["sin"]),
          lambda P, I: torch_rope(P["x"], I["cos"], I["sin"]), {"x": randn(rng, 2, 2, 3, 6)},
          {"cos": cos, "sin": sin})


def test_rope_arbitrary_tables():
    """Any cos / sin tables, not only rotations (the op is the formula)."""
    rng = np.random.default_rng(19)
    check(lambda g, P, I: g.rope(P["x"], I["cos"], I["sin"]),
          lambda P, I: torch_rope(P["x"], I["cos"], I["sin"]), {"x": randn(rng, 1, 2, 4, 4)},
          {"cos": randn(rng, 4, 2), "sin": randn(rng, 4, 2)})


def test_rope_gradient_for_tables_is_refused():
    g = tg.Graph("t")
    x, c, s = g.param("x", [1, 1, 2, 4]), g.param("cos", [2, 2]), g.param("sin", [2, 2])
    y = g.rope(x, c, s)
    with pytest.raises(NotImplementedError, match=f"rope %{y.name} with respect to cos and sin"):
        g.backward(g.sum(y), [x, c, s])


def torch_attention(q, k, v, causal, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        S, Sk = s.shape[-2:]
        mask = torch.ones(S, Sk, dtype=torch.bool).triu(1)  # j > i
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (2, 2), (3, 1)])
@pytest.mark.parametrize("sk", [2, 3, 5])
def test_attention(causal, hq, hkv, sk):
    """Causal is top-left aligned (key j masked for query i when j > i),
    GQA query head h reads kv head h // (hq / hkv); o and lse compared,
    the gradients of q, k, v through o."""
    rng = np.random.default_rng(20)
    B, S, D, scale = 2, 3, 4, 0.7
    p = {"q": randn(rng, B, hq, S, D), "k": randn(rng, B, hkv, sk, D),
         "v": randn(rng, B, hkv, sk, D)}
    check(lambda g, P, I: g.attention(P["q"], P["k"], P["v"], causal, scale),
          lambda P, I: torch_attention(P["q"], P["k"], P["v"], causal, scale), p)


def test_attention_default_scale():
    rng = np.random.default_rng(21)
    p = {"q": randn(rng, 1, 2, 4, 8), "k": randn(rng, 1, 1, 4, 8), "v": randn(rng, 1, 1, 4, 8)}
    check(lambda g, P, I: g.attention(P["q"], P["k"], P["v"]),
          lambda P, I: torch_attention(P["q"], P["k"], P["v"], True, 1 / math.sqrt(8)), p)


def test_attention_lse_gradient_is_refused():
    g = tg.Graph("t")
    q = g.param("q", [1, 1, 2, 2])
    _, lse = g.attention(q, q, q, True, 1.0)
    with pytest.raises(NotImplementedError, match="lse"):
        g.backward(g.sum(lse), [q])


# -- shape ops --------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, -1), (24,), (2, 1, 12), (-1, 3, 2, 2)])
def test_reshape(shape):
    rng = np.random.default_rng(22)
    check(lambda g, P, I: g.reshape(P["x"], shape), lambda P, I: P["x"].reshape(shape),
          {"x": randn(rng, 2, 3, 4)})


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1), (0, 1, 2)])
def test_transpose(perm):
    rng = np.random.default_rng(23)
    check(lambda g, P, I: g.transpose(P["x"], perm), lambda P, I: P["x"].permute(perm),
          {"x": randn(rng, 2, 3, 4)})


@pytest.mark.parametrize("axis,start,end", [(0, 1, 2), (1, 1, 3), (2, 0, 1), (-1, 1, 4)])
def test_slice(axis, start, end):
    rng = np.random.default_rng(24)
    check(lambda g, P, I: g.slice(P["x"], axis, start, end),
          lambda P, I: P["x"].narrow(axis, start, end - start), {"x": randn(rng, 2, 3, 4)})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    rng = np.random.default_rng(25)
    shapes = {0: [(1, 3, 4), (2, 3, 4), (1, 3, 4)], 1: [(2, 1, 4), (2, 3, 4), (2, 2, 4)],
              -1: [(2, 3, 2), (2, 3, 1), (2, 3, 4)]}[axis]
    p = {f"x{i}": randn(rng, *s) for i, s in enumerate(shapes)}
    check(lambda g, P, I: g.concat([P["x0"], P["x1"], P["x2"]], axis),
          lambda P, I: torch.cat([P["x0"], P["x1"], P["x2"]], axis), p)


def test_concat_same_value_twice():
    rng = np.random.default_rng(26)
    check(lambda g, P, I: g.concat([P["x"], P["x"]], 0), lambda P, I: torch.cat([P["x"]] * 2, 0),
          {"x": randn(rng, 2, 3)})


@pytest.mark.parametrize("to", ["bf16", "fp32", "fp16"])
def test_cast(to):
    """The reference interpreter does not round to the target dtype: cast is
    the identity on values (a torch float64 identity), the type changes."""
    rng = np.random.default_rng(27)

    def build(g, P, I):
        y = g.cast(P["x"], to)
        assert y.dtype == {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}[to]
        return y

    check(build, lambda P, I: P["x"] * 1.0, {"x": randn(rng, 3, 4)})


@pytest.mark.parametrize("axes,keepdims", [(None, False), ([1], False), ([1], True),
                                           ([0, 2], False), ([-1], True), ([0, 1, 2], True)])
def test_sum(axes, keepdims):
    rng = np.random.default_rng(28)
    dims = tuple(axes) if axes is not None else (0, 1, 2)
    check(lambda g, P, I: g.sum(P["x"], axes, keepdims),
          lambda P, I: P["x"].sum(dim=dims, keepdim=keepdims), {"x": randn(rng, 2, 3, 4)})


@pytest.mark.parametrize("src,dst", [((3, 1), (2, 3, 4)), ((4,), (3, 4)), ((), (2, 2)),
                                     ((1, 3, 1), (2, 3, 4)), ((2, 3), (2, 3))])
def test_broadcast(src, dst):
    rng = np.random.default_rng(29)
    check(lambda g, P, I: g.broadcast(P["x"], dst), lambda P, I: P["x"].expand(dst),
          {"x": randn(rng, *src)})


@pytest.mark.parametrize("axis,before,after", [(0, 1, 2), (1, 0, 3), (-1, 2, 0)])
def test_pad(axis, before, after):
    """pad (no builder; add_op by name): zeros around x along axis."""
    rng = np.random.default_rng(30)
    x = randn(rng, 2, 3, 4)
    ax = axis % 3
    spec = [0, 0] * (2 - ax) + [before, after]
    check(lambda g, P, I: g.op("pad", P["x"], axis=axis, before=before, after=after),
          lambda P, I: F.pad(P["x"], spec), {"x": x})


def test_full():
    rng = np.random.default_rng(31)
    check(lambda g, P, I: P["x"] * g.full([4], 0.5) + g.full([3, 1], -2.0),
          lambda P, I: P["x"] * 0.5 - 2.0, {"x": randn(rng, 3, 4)})


# -- whole blocks -----------------------------------------------------------------


def gpt2_params(rng, V, S, D, F_):
    def p(*s):
        return randn(rng, *s, scale=0.5)

    return {"wte": p(V, D), "wpe": p(S, D), "ln1.g": 1 + p(D), "ln1.b": p(D),
            "attn.wqkv": p(D, 3 * D), "attn.bqkv": p(3 * D), "attn.wo": p(D, D),
            "attn.bo": p(D), "ln2.g": 1 + p(D), "ln2.b": p(D), "mlp.w1": p(D, F_),
            "mlp.b1": p(F_), "mlp.w2": p(F_, D), "mlp.b2": p(D), "lnf.g": 1 + p(D),
            "lnf.b": p(D)}


def test_gpt2_block():
    """Token + position embedding, pre-LN causal attention and GELU MLP with
    biases, a final LayerNorm and the tied LM head; mean cross-entropy with
    an ignored token. The loss and every parameter gradient vs torch."""
    rng = np.random.default_rng(40)
    B, S, D, H, V, F_ = 2, 4, 8, 2, 7, 16
    hd = D // H
    params = gpt2_params(rng, V, S, D, F_)
    inputs = {"ids": np.array([[1, 4, 0, 2], [6, 6, 3, 5]], dtype=np.int32),
              "targets": np.array([[4, 0, 2, 3], [6, -100, 5, 1]], dtype=np.int32)}

    def build(g, P, I):
        x = g.embedding(P["wte"], I["ids"]) + P["wpe"]
        qkv = g.layernorm(x, P["ln1.g"], P["ln1.b"]) @ P["attn.wqkv"] + P["attn.bqkv"]

        def heads(i):
            t = g.reshape(g.slice(qkv, 2, i * D, (i + 1) * D), [B, S, H, hd])
            return g.transpose(t, [0, 2, 1, 3])

        o, _ = g.attention(heads(0), heads(1), heads(2), True, 1 / math.sqrt(hd))
        o = g.reshape(g.transpose(o, [0, 2, 1, 3]), [B, S, D])
        x = x + (o @ P["attn.wo"] + P["attn.bo"])
        h = g.gelu(g.layernorm(x, P["ln2.g"], P["ln2.b"]) @ P["mlp.w1"] + P["mlp.b1"])
        x = x + (h @ P["mlp.w2"] + P["mlp.b2"])
        logits = g.matmul(g.layernorm(x, P["lnf.g"], P["lnf.b"]), P["wte"], trans_b=True)
        return g.cross_entropy(logits, I["targets"])

    def ref(P, I):
        x = F.embedding(I["ids"], P["wte"]) + P["wpe"]
        qkv = F.layer_norm(x, (D,), P["ln1.g"], P["ln1.b"]) @ P["attn.wqkv"] + P["attn.bqkv"]
        q, k, v = (t.reshape(B, S, H, hd).transpose(1, 2) for t in qkv.split(D, -1))
        o, _ = torch_attention(q, k, v, True, 1 / math.sqrt(hd))
        x = x + (o.transpose(1, 2).reshape(B, S, D) @ P["attn.wo"] + P["attn.bo"])
        h = F.gelu(F.layer_norm(x, (D,), P["ln2.g"], P["ln2.b"]) @ P["mlp.w1"] + P["mlp.b1"])
        x = x + (h @ P["mlp.w2"] + P["mlp.b2"])
        logits = F.layer_norm(x, (D,), P["lnf.g"], P["lnf.b"]) @ P["wte"].T
        return F.cross_entropy(logits.reshape(-1, V), I["targets"].reshape(-1))

    check(build, ref, params, inputs, weighted=False)


def llama_dims():
    return dict(B=2, S=4, D=8, Hq=4, Hkv=2, hd=4, F_=12, V=7)


def llama_params(rng, D, Hq, Hkv, hd, F_, V, **_):
    def p(*s):
        return randn(rng, *s, scale=0.5)

    return {"tok": p(V, D), "norm1": 1 + p(D), "wq": p(D, Hq * hd), "wk": p(D, Hkv * hd),
            "wv": p(D, Hkv * hd), "wo": p(Hq * hd, D), "norm2": 1 + p(D), "w_gate": p(D, F_),
            "w_up": p(D, F_), "w_down": p(F_, D), "norm_f": 1 + p(D), "lm_head": p(D, V)}


def llama_inputs(S, hd, **_):
    cos, sin = rope_tables(S, hd)
    return {"ids": np.array([[1, 4, 0, 2], [6, 6, 3, 5]], dtype=np.int32),
            "targets": np.array([[4, 0, 2, 3], [6, 1, -100, 5]], dtype=np.int32),
            "cos": cos, "sin": sin}


def llama_build(g, P, I, B, S, D, Hq, Hkv, hd, F_, V):
    """A Llama-style block with tern.graph: RMSNorm, RoPE, GQA, SwiGLU."""
    x = g.embedding(P["tok"], I["ids"])
    h = g.rmsnorm(x, P["norm1"], 1e-5)

    def heads(w, n):
        return g.transpose(g.reshape(h @ w, [B, S, n, hd]), [0, 2, 1, 3])

    q = g.rope(heads(P["wq"], Hq), I["cos"], I["sin"])
    k = g.rope(heads(P["wk"], Hkv), I["cos"], I["sin"])
    o, _ = g.attention(q, k, heads(P["wv"], Hkv), True, 1 / math.sqrt(hd))
    x = x + g.reshape(g.transpose(o, [0, 2, 1, 3]), [B, S, Hq * hd]) @ P["wo"]
    h2 = g.rmsnorm(x, P["norm2"], 1e-5)
    x = x + (g.silu(h2 @ P["w_gate"]) * (h2 @ P["w_up"])) @ P["w_down"]
    logits = g.rmsnorm(x, P["norm_f"], 1e-5) @ P["lm_head"]
    return g.cross_entropy(logits, I["targets"])


def test_llama_block():
    """Loss and every parameter gradient vs the same model in torch."""
    rng = np.random.default_rng(41)
    d = llama_dims()
    B, S, D, Hq, Hkv, hd, V = (d[k] for k in ("B", "S", "D", "Hq", "Hkv", "hd", "V"))

    def ref(P, I):
        x = F.embedding(I["ids"], P["tok"])
        h = torch_rmsnorm(x, P["norm1"], 1e-5)

        def heads(w, n):
            return (h @ w).reshape(B, S, n, hd).transpose(1, 2)

        q = torch_rope(heads(P["wq"], Hq), I["cos"], I["sin"])
        k = torch_rope(heads(P["wk"], Hkv), I["cos"], I["sin"])
        o, _ = torch_attention(q, k, heads(P["wv"], Hkv), True, 1 / math.sqrt(hd))
        x = x + o.transpose(1, 2).reshape(B, S, Hq * hd) @ P["wo"]
        h2 = torch_rmsnorm(x, P["norm2"], 1e-5)
        x = x + (F.silu(h2 @ P["w_gate"]) * (h2 @ P["w_up"])) @ P["w_down"]
        logits = torch_rmsnorm(x, P["norm_f"], 1e-5) @ P["lm_head"]
        return F.cross_entropy(logits.reshape(-1, V), I["targets"].reshape(-1))

    check(lambda g, P, I: llama_build(g, P, I, **d), ref, llama_params(rng, **d),
          llama_inputs(**d), weighted=False)


# -- the text form ----------------------------------------------------------------


def llama_graph():
    d = llama_dims()
    rng = np.random.default_rng(42)
    params, inputs = llama_params(rng, **d), llama_inputs(**d)
    g = tg.Graph("llama_block")
    P = {n: g.param(n, a.shape, "bf16") for n, a in params.items()}
    I = {"ids": g.input("ids", [2, 4], "int32"), "targets": g.input("targets", [2, 4], "int32"),
         "cos": g.input("cos", inputs["cos"].shape), "sin": g.input("sin", inputs["sin"].shape)}
    loss = llama_build(g, P, I, **d)
    g.mark_output(loss)
    grads = g.backward(loss, list(P.values()))
    g.mark_output(*grads.values())
    return g, {**params, **inputs}


def test_text_round_trip(tmp_path):
    g, feeds = llama_graph()
    text = str(g)
    back = tg.parse(text, "llama.tgraph")
    assert str(back) == text
    assert text == _core.print_graph(g.core)
    assert [t.name for t in back.outputs] == [t.name for t in g.outputs]
    # The parsed graph computes the same values.
    want, got = g.evaluate(feeds), back.evaluate(feeds)
    assert list(got) == list(want) == [t.name for t in g.outputs]
    assert len(want) == 13  # the loss and 12 parameter gradients
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
    # Through a file.
    path = str(tmp_path / "llama.tgraph")
    g.save(path)
    assert str(tg.load(path)) == text
    # Every attribute kind, a non-finite real and a generic node.
    h = tg.Graph("attrs")
    x = h.input("x", [2, 3])
    h.mark_output(h.scale(h.transpose(x, [1, 0]), 2.0), h.cast(x, "bf16"),
                  h.full([2], float("-inf")), h.full([1], float("inf")),
                  h.op("pad", x, axis=-1, before=1, after=0, names=["padded"]),
                  h.sum(x, [-1], keepdims=True))
    t2 = str(h)
    assert "value = 2.0" in t2 and "dtype = bfloat16" in t2 and "%padded = pad" in t2
    assert str(tg.parse(t2)) == t2


# -- errors -----------------------------------------------------------------------


def test_shape_errors_name_the_op_and_values():
    g = tg.Graph("m")
    a, w = g.input("a", [4, 8], "bf16"), g.param("w", [16, 4], "bf16")
    with pytest.raises(tg.TernError, match=r"graph m: matmul %a, %w: contraction dims differ.*"
                                           r"K = 8.*K = 16"):
        g.matmul(a, w)
    c = g.param("c", [3, 8], "bf16")
    with pytest.raises(tg.TernError, match=r"add %a, %c: shapes \[4, 8\] and \[3, 8\] do not "
                                           r"broadcast"):
        a + c
    with pytest.raises(tg.TernError, match=r"add %a, %f: dtypes differ"):
        g.add(a, g.param("f", [4, 8], "fp32"))
    with pytest.raises(tg.TernError, match=r"reshape %a: cannot reshape"):
        g.reshape(a, [5, 7])
    with pytest.raises(tg.TernError, match=r"attention %q, %a, %a: .*must be \[B, Hq, S, D\]"):
        g.attention(g.input("q", [2, 3, 4], "bf16"), a, a, True, 1.0)
    with pytest.raises(tg.TernError, match=r"%a is defined twice"):
        g.input("a", [2])
    with pytest.raises(tg.TernError, match="unknown dtype 'float9'"):
        g.input("z", [2], "float9")
    assert isinstance(tg.TernError("x"), RuntimeError)


def test_add_op_errors():
    g = tg.Graph("m")
    x = g.input("x", [2, 3])
    with pytest.raises(tg.TernError, match="unknown op 'matmal'; known: input, param"):
        g.op("matmal", x, x)
    with pytest.raises(tg.TernError, match=r"graph m: softmax %x, %x: takes 1 inputs, got 2"):
        g.op("softmax", x, x)
    with pytest.raises(tg.TernError, match=r"slice %x: slice \[1, 5\) is out of range"):
        g.op("slice", x, axis=1, start=1, end=5)
    with pytest.raises(tg.TernError, match="attribute 'shape': a list holds integers only"):
        g.op("reshape", x, shape=[3, 2.0])
    with pytest.raises(tg.TernError, match="'softmax' is not an activation"):
        g.act("softmax", x)
    assert g.core.num_values() == 1  # nothing was added


def test_parse_errors_name_the_line():
    head = "graph t {\n  %x = input : [2, 3] float32\n"
    with pytest.raises(tg.TernError, match=r"^f\.tgraph:3: unknown op 'matmal'"):
        tg.parse(head + "  %y = matmal %x, %x : [2, 2] float32\n}\n", "f.tgraph")
    with pytest.raises(tg.TernError, match=r"^f\.tgraph:4: .*softmax %x.*takes 1 inputs"):
        tg.parse(head + "\n  %y = softmax %x, %x : [2, 3] float32\n}\n", "f.tgraph")
    with pytest.raises(tg.TernError, match=r"^<text>:3: %q is used before it is defined"):
        tg.parse(head + "  %y = add %x, %q : [2, 3] float32\n}\n")
    with pytest.raises(tg.TernError, match=r"^f\.tgraph:3: .*the text says \[2, 4\] float32, "
                                           r"softmax gives \[2, 3\] float32"):
        tg.parse(head + "  %y = softmax %x : [2, 4] float32\n}\n", "f.tgraph")
    with pytest.raises(tg.TernError, match="not closed"):
        tg.parse(head, "f.tgraph")
    with pytest.raises(tg.TernError, match="cannot read"):
        tg.load("/nonexistent/x.tgraph")


def test_backward_and_evaluate_errors():
    g = tg.Graph("m")
    x, t = g.param("x", [2, 3]), g.input("t", [2], "int32")
    with pytest.raises(tg.TernError, match=r"the loss %x must be a scalar \[\], got \[2, 3\]"):
        g.backward(x, [x])
    loss = g.cross_entropy(x, t)
    with pytest.raises(tg.TernError, match="no value fed for %t"):
        g.evaluate({"x": np.zeros((2, 3))}, [loss])
    with pytest.raises(tg.TernError, match=r"feed %x: shape \[3, 2\], the graph says \[2, 3\]"):
        g.evaluate({"x": np.zeros((3, 2)), "t": [0, 1]}, [loss])
    with pytest.raises(tg.TernError, match=r"cross_entropy %t\d+: .*id 3 at position 1"):
        g.evaluate({"x": np.zeros((2, 3)), "t": [0, 3]}, [loss])
    other = tg.Graph("o")
    with pytest.raises(ValueError, match="belongs to graph o"):
        g.add(x, other.param("y", [2, 3]))
    with pytest.raises(KeyError):
        g["nope"]
    out = g.evaluate({x: np.zeros((2, 3)), "t": np.array([0, 1])}, [loss, "x"])
    assert out[loss.name].shape == () and out[loss.name] == pytest.approx(math.log(3))


def test_core_api():
    """tern._core directly: values are int ids; evaluate returns one float64
    array per value, shaped like it."""
    g = _core.Graph("c")
    x = g.input("x", [2, 3], "bf16")
    w = g.param("w", [3, 4], "bfloat16")
    y = g.matmul(x, w, trans_a=False, trans_b=False)
    o, lse = g.attention(*([g.reshape(y, [1, 1, 2, 4])] * 3), causal=False, scale=0.5)
    loss = g.sum(g.cast(o, "fp32"))
    g.mark_output(loss)
    grads = _core.add_backward(g, loss, [w])
    assert set(grads) == {w} and g.value_name(grads[w]) == "grad.w"
    assert (g.name, g.outputs, g.find("w"), g.find("nope")) == ("c", [loss], w, -1)
    assert (g.shape(y), g.dtype(y), g.value_name(y)) == ([2, 4], "bfloat16", "t0")
    v = g.value(lse)
    assert (v.name, v.shape, v.dtype, v.index) == (g.value_name(lse), [1, 1, 2], "float32", 1)
    assert g.producer(y) == ("matmul", [x, w], {}, [y])
    assert g.producer(o)[0] == "attention" and g.producer(o)[2] == {"causal": 0, "scale": 0.5}
    gm = g.param("gm", [3])
    ids = g.add_op("layernorm_backward", [x, x, gm], {"eps": 1e-3}, ["dx", "dg", "db"])
    assert [g.value_name(i) for i in ids] == ["dx", "dg", "db"]
    rng = np.random.default_rng(50)
    feeds = {"x": rng.standard_normal((2, 3)), "w": rng.standard_normal((3, 4)),
             "gm": rng.standard_normal(3)}
    vals = _core.evaluate(g, feeds)
    assert len(vals) == g.num_values()
    for i, a in enumerate(vals):
        assert a.dtype == np.float64 and list(a.shape) == g.shape(i)
    np.testing.assert_allclose(vals[y], feeds["x"] @ feeds["w"], rtol=1e-15)
    picked = _core.evaluate(g, feeds, [loss, grads[w]])
    assert picked[0] == vals[loss] and np.array_equal(picked[1], vals[grads[w]])
    assert _core.print_graph(g) == str(g) and str(_core.parse_graph(str(g))) == str(g)
