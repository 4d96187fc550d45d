"""Compiled graphs on the simulated chip against PyTorch (python3-torch,
float64): a GPT-2 block's and a Llama block's training steps written with
tern.graph, compiled for trn3 and run on the device in bf16, loss and every
parameter gradient vs torch autograd on the same bf16-rounded parameters. Tolerance: 1 % of
the loss, 2 % of each gradient's largest magnitude (bf16 carries 8
significant bits and every kernel rounds its outputs to bf16; measured
errors are 0.3-1 %)."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from tern import graph as tg


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def check_step(out, loss, grads, ref, tp):
    """The device's loss within 1 % of torch's, each gradient within 2 % of
    its largest magnitude."""
    assert abs(out[loss.name].item() - ref.item()) <= 0.01 * abs(ref.item())
    for name, t in grads.items():
        want = tp[name].grad.numpy()
        got = out[t.name].reshape(want.shape)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= 0.02, f"grad of {name}: error {err:.3g}"


def test_gpt2_block_training_step_on_the_device_matches_torch():
    rng = np.random.default_rng(7)
    B, S, D, H, V, F_ = 2, 64, 128, 2, 97, 256
    hd = D // H

    def p(*shape, scale=0.05):
        return bf16(rng.standard_normal(shape) * scale)

    P = {"wte": p(V, D), "wpe": p(S, D), "ln1.g": bf16(1 + p(D)), "ln1.b": p(D),
         "wqkv": p(D, 3 * D), "bqkv": p(3 * D), "wo": p(D, D), "bo": p(D),
         "ln2.g": bf16(1 + p(D)), "ln2.b": p(D), "w1": p(D, F_), "b1": p(F_), "w2": p(F_, D),
         "b2": p(D), "lnf.g": bf16(1 + p(D)), "lnf.b": p(D)}
    ids = rng.integers(0, V, size=(B, S)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, S)).astype(np.int32)
    targets[0, 5] = -100  # an ignored token

    g = tg.Graph("gpt2_block")
    T = {k: g.param(k, list(v.shape), "bf16") for k, v in P.items()}
    I = {"ids": g.input("ids", [B, S], "int32"), "targets": g.input("targets", [B, S], "int32")}
    x = g.embedding(T["wte"], I["ids"]) + T["wpe"]
    qkv = g.layernorm(x, T["ln1.g"], T["ln1.b"]) @ T["wqkv"] + T["bqkv"]

    def heads(i):
        t = g.reshape(g.slice(qkv, 2, i * D, (i + 1) * D), [B, S, H, hd])
        return g.transpose(t, [0, 2, 1, 3])

    o, _ = g.attention(heads(0), heads(1), heads(2), True, 1 / math.sqrt(hd))
    x = x + (g.reshape(g.transpose(o, [0, 2, 1, 3]), [B, S, D]) @ T["wo"] + T["bo"])
    h = g.gelu(g.layernorm(x, T["ln2.g"], T["ln2.b"]) @ T["w1"] + T["b1"])
    x = x + (h @ T["w2"] + T["b2"])
    logits = g.matmul(g.layernorm(x, T["lnf.g"], T["lnf.b"]), T["wte"], trans_b=True)
    loss = g.cross_entropy(logits, I["targets"])
    grads = g.backward(loss, list(T.values()))
    g.mark_output(loss, *grads.values())

    c = g.compile("trn3", cores=2)
    assert not c.executable.unlowered
    feeds = dict(P, ids=ids, targets=targets)
    out, ns = c.run(feeds)
    assert ns > 0

    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in P.items()}
    tids, ttg = torch.tensor(ids, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
    xt = F.embedding(tids, tp["wte"]) + tp["wpe"]
    q, k, v = (t.reshape(B, S, H, hd).transpose(1, 2)
               for t in (F.layer_norm(xt, (D,), tp["ln1.g"], tp["ln1.b"]) @ tp["wqkv"]
                         + tp["bqkv"]).split(D, -1))
    sc = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    sc = sc.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    ot = torch.softmax(sc, -1) @ v
    xt = xt + (ot.transpose(1, 2).reshape(B, S, D) @ tp["wo"] + tp["bo"])
    ht = F.gelu(F.layer_norm(xt, (D,), tp["ln2.g"], tp["ln2.b"]) @ tp["w1"] + tp["b1"])
    xt = xt + (ht @ tp["w2"] + tp["b2"])
    lt = F.layer_norm(xt, (D,), tp["lnf.g"], tp["lnf.b"]) @ tp["wte"].T
    ref = F.cross_entropy(lt.reshape(-1, V), ttg.reshape(-1), ignore_index=-100)
    ref.backward()

    check_step(out, loss, grads, ref, tp)


def test_llama_block_training_step_on_the_device_matches_torch():
    """A Llama-style block (RMSNorm, RoPE, SwiGLU, GQA 4:2) compiled for
    training and run on the simulated trn3 in bf16, against torch float64
    autograd on the same bf16 parameters (same tolerances as GPT-2)."""
    rng = np.random.default_rng(11)
    B, S, D, H, KV, V, F_ = 2, 64, 256, 4, 2, 101, 384
    hd = D // H

    def p(*shape, scale=0.05):
        return bf16(rng.standard_normal(shape) * scale)

    P = {"emb": p(V, D), "n1": bf16(1 + p(D)), "wq": p(D, D), "wk": p(D, KV * hd),
         "wv": p(D, KV * hd), "wo": p(D, D), "n2": bf16(1 + p(D)), "wg": p(D, F_),
         "wu": p(D, F_), "wd": p(F_, D), "nf": bf16(1 + p(D)), "head": p(D, V)}
    ids = rng.integers(0, V, size=(B, S)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, S)).astype(np.int32)
    inv = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(S)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    g = tg.Graph("llama_block")
    T = {k: g.param(k, list(v.shape), "bf16") for k, v in P.items()}
    I = {"ids": g.input("ids", [B, S], "int32"), "targets": g.input("targets", [B, S], "int32"),
         "cos": g.input("cos", [S, hd // 2], "fp32"), "sin": g.input("sin", [S, hd // 2], "fp32")}
    x = g.embedding(T["emb"], I["ids"])
    h = g.rmsnorm(x, T["n1"], 1e-6)

    def heads(w, n, rope=True):
        t = g.transpose(g.reshape(h @ w, [B, S, n, hd]), [0, 2, 1, 3])
        return g.rope(t, I["cos"], I["sin"]) if rope else t

    q, k, v = heads(T["wq"], H), heads(T["wk"], KV), heads(T["wv"], KV, rope=False)
    o, _ = g.attention(q, k, v, True, 1 / math.sqrt(hd))
    x = x + g.reshape(g.transpose(o, [0, 2, 1, 3]), [B, S, D]) @ T["wo"]
    h2 = g.rmsnorm(x, T["n2"], 1e-6)
    x = x + (g.silu(h2 @ T["wg"]) * (h2 @ T["wu"])) @ T["wd"]
    logits = g.rmsnorm(x, T["nf"], 1e-6) @ T["head"]
    loss = g.cross_entropy(logits, I["targets"])
    grads = g.backward(loss, list(T.values()))
    g.mark_output(loss, *grads.values())

    c = g.compile("trn3", cores=2)
    assert not c.executable.unlowered
    out, ns = c.run(dict(P, ids=ids, targets=targets, cos=cos, sin=sin))
    assert ns > 0

    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in P.items()}
    tc, ts = torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    def rope(t):  # rotate-half, t [B, n, S, hd]
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([a * tc - b * ts, b * tc + a * ts], -1)

    xt = F.embedding(torch.tensor(ids, dtype=torch.long), tp["emb"])
    ht = rms(xt, tp["n1"])
    qt = rope((ht @ tp["wq"]).reshape(B, S, H, hd).transpose(1, 2))
    kt = rope((ht @ tp["wk"]).reshape(B, S, KV, hd).transpose(1, 2))
    vt = (ht @ tp["wv"]).reshape(B, S, KV, hd).transpose(1, 2)
    kt, vt = kt.repeat_interleave(H // KV, 1), vt.repeat_interleave(H // KV, 1)
    sc = (qt @ kt.transpose(-1, -2)) / math.sqrt(hd)
    sc = sc.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    xt = xt + (torch.softmax(sc, -1) @ vt).transpose(1, 2).reshape(B, S, D) @ tp["wo"]
    h2t = rms(xt, tp["n2"])
    xt = xt + (F.silu(h2t @ tp["wg"]) * (h2t @ tp["wu"])) @ tp["wd"]
    lt = rms(xt, tp["nf"]) @ tp["head"]
    ref = F.cross_entropy(lt.reshape(-1, V), torch.tensor(targets, dtype=torch.long).reshape(-1))
    ref.backward()

    check_step(out, loss, grads, ref, tp)
