"""The flash attention kernels (forward, backward) and RoPE against PyTorch:
attention computed explicitly in float64 (torch 1.13 has no
scaled_dot_product_attention), gradients by autograd."""
import math

import numpy as np
import pytest
import torch

from tern import _core


def bf16(x):
    """Round float32 values to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


ROUND = {"bf16": bf16, "fp16": lambda x: np.asarray(x, np.float16).astype(np.float32)}
# |got - want| <= TOL * (1 + |want|): the inputs' dtype rounding of P, dS and
# Q * scale (once each) and of the outputs: 8 significant bits (bf16) or 11
# (fp16), with margin for sums of a few hundred rounded terms.
TOL = {"bf16": 3e-2, "fp16": 6e-3}


def attention_ref(q, k, v, causal, groups):
    """q [B, Hq, S, D], k, v [B, Hkv, Sk, D] float64 tensors -> o, lse."""
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril()  # top-left, as torch's is_causal
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def run(chip, name, inputs, **params):
    c = _core.load_chip(chip)
    sim = _core.Simulator(c)
    sim.load(_core.build_kernel(c, name, **params))
    for key, val in inputs.items():
        sim.write(key, np.ascontiguousarray(val, np.float32).ravel())
    sim.run()
    return sim


@pytest.mark.parametrize(
    "b,hq,hkv,s,d,causal,cores,dtype",
    [
        (1, 2, 2, 77, 64, True, 1, "bf16"),
        (1, 4, 1, 200, 128, True, 2, "bf16"),
        (2, 2, 1, 130, 64, False, 2, "bf16"),
        (1, 2, 2, 1, 128, True, 1, "bf16"),
        (1, 2, 1, 150, 64, True, 1, "fp16"),
    ],
)
def test_forward_and_backward_against_torch(b, hq, hkv, s, d, causal, cores, dtype):
    rnd = ROUND[dtype]
    rng = np.random.default_rng(7)
    q = rnd(rng.standard_normal((b, hq, s, d)).astype(np.float32))
    k = rnd(rng.standard_normal((b, hkv, s, d)).astype(np.float32))
    v = rnd(rng.standard_normal((b, hkv, s, d)).astype(np.float32))
    do = rnd(rng.standard_normal((b, hq, s, d)).astype(np.float32))
    params = dict(batch=b, q_heads=hq, kv_heads=hkv, seq=s, head_dim=d, causal=int(causal),
                  cores=cores, dtype=dtype)
    # Kernel layouts: q, k pre-transposed [B, H, D, S]; v, o, do [B, H, S, D].
    fwd = run("trn3", "flash_attention",
              {"q": q.transpose(0, 1, 3, 2), "k": k.transpose(0, 1, 3, 2), "v": v}, **params)
    o = np.array(fwd.read("o")).reshape(b, hq, s, d)
    lse = np.array(fwd.read("lse")).reshape(b, hq, s)

    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    ro, rlse = attention_ref(tq, tk, tv, causal, hq // hkv)
    tol = TOL[dtype]
    np.testing.assert_allclose(o, ro.detach().numpy(), atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, rlse.detach().numpy(), atol=tol / 2, rtol=1e-3)

    ro.backward(torch.tensor(do, dtype=torch.float64))
    bwd = run("trn3", "flash_attention_backward",
              {"q": q.transpose(0, 1, 3, 2), "k": k.transpose(0, 1, 3, 2), "v": v, "o": o,
               "do": do, "lse": lse}, **params)
    dq = np.array(bwd.read("dq")).reshape(b, hq, d, s).transpose(0, 1, 3, 2)
    dk = np.array(bwd.read("dk")).reshape(b, hkv, d, s).transpose(0, 1, 3, 2)
    dv = np.array(bwd.read("dv")).reshape(b, hkv, s, d)
    # Gradients sum many rounded terms: the absolute tolerance grows with
    # the square root of their number (dk, dv of a GQA head sum over its
    # query heads).
    grow = max(1.0, math.sqrt(s * hq / hkv / 64))
    for name, got, want in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad)):
        np.testing.assert_allclose(got, want.numpy(), atol=tol * grow, rtol=tol, err_msg=name)


@pytest.mark.parametrize("backward", [False, True])
def test_rope_against_torch(backward):
    b, h, s, d = 1, 3, 150, 64
    rng = np.random.default_rng(3)
    x = bf16(rng.standard_normal((b, h, s, d)).astype(np.float32))
    inv = 10000.0 ** (-np.arange(0, d, 2) / d)
    theta = np.arange(s)[:, None] * inv[None, :]
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    sim = run("trn3", "rope", {"x": x, "cos": cos, "sin": sin}, batch=b, heads=h, seq=s,
              head_dim=d, backward=int(backward))
    y = np.array(sim.read("y")).reshape(b, h, s, d)

    # HF Llama's apply_rotary_pos_emb (rotate_half) in float64; the backward
    # is the vector-Jacobian product of the forward (a rotation by -theta).
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    c = torch.tensor(np.concatenate([cos, cos], -1), dtype=torch.float64)
    sn = torch.tensor(np.concatenate([sin, sin], -1), dtype=torch.float64)

    def rotate_half(t):
        return torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1)

    fy = tx * c + rotate_half(tx) * sn
    if backward:
        fy.backward(tx.detach())
        want = tx.grad.numpy()
    else:
        want = fy.detach().numpy()
    np.testing.assert_allclose(y, want, atol=2e-2, rtol=1e-2)


def test_bad_shapes_name_the_parameter():
    chip = _core.load_chip("trn3")
    with pytest.raises(Exception, match="head_dim 96"):
        _core.build_kernel(chip, "flash_attention", head_dim=96, seq=128)
    with pytest.raises(Exception, match="q_heads"):
        _core.build_kernel(chip, "flash_attention", q_heads=6, kv_heads=4, seq=128)
    with pytest.raises(Exception, match="seq_q must be >= 1"):
        _core.build_kernel(chip, "flash_attention_backward", seq=0)
