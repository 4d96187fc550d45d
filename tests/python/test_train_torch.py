"""The trainer against PyTorch, as llm.c checks its trainer: a tiny GPT-2
(2 layers, dim 128, 2 heads, vocab 65, 4 x 64 tokens) with tern's random
initial weights and one fixed batch. tern.Trainer runs the whole step on
the simulated chip (grad program, health checks, clipping, AdamW program);
the same model in PyTorch (fp32, torch.optim.AdamW with nanoGPT's decay
groups, clip_grad_norm_) is the reference. Compared: the logits before
training, the loss and every gradient tensor of the first step, and the
losses of 10 AdamW steps on that batch. Tolerances per recipe are stated in
TOL (max abs error relative to the reference's max abs value for logits and
gradients; relative error for losses): the fp32 recipe is fp32 on the chip
(FP32 matmuls at 1/4 rate, FP32 attention); bf16 rounds weights and
activations to 8 significant bits; mxfp8 quantizes every linear layer's
operands to E4M3 in blocks of 32."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tern import _core

DATA = os.environ.get("TERN_DATA_DIR", os.path.join(os.path.dirname(__file__), "../../data"))
L, D, H, V, B, S = 2, 128, 2, 65, 4, 64
# recipe: (logits, loss, gradients, 10-step losses)
TOL = {  # measured (this machine): fp32 5.7e-7 1.1e-7 8.3e-7 2.9e-7; bf16 5.0e-3 5.9e-6 5.7e-3
    # 4.0e-4; mxfp8 5.5e-2 2.9e-4 8.1e-2 1.5e-3
    "fp32": (1e-5, 1e-5, 1e-5, 1e-5),
    "bf16": (2e-2, 1e-3, 2e-2, 3e-3),
    "mxfp8": (1e-1, 3e-3, 1.5e-1, 1e-2),
}


def shapes():
    s = {"wte": (V, D), "wpe": (S, D), "ln_f.w": (D,), "ln_f.b": (D,)}
    for l in range(L):
        p = f"h.{l}."
        s.update({p + "ln_1.w": (D,), p + "ln_1.b": (D,), p + "attn.c_attn.w": (D, 3 * D),
                  p + "attn.c_attn.b": (3 * D,), p + "attn.c_proj.w": (D, D),
                  p + "attn.c_proj.b": (D,), p + "ln_2.w": (D,), p + "ln_2.b": (D,),
                  p + "mlp.c_fc.w": (D, 4 * D), p + "mlp.c_fc.b": (4 * D,),
                  p + "mlp.c_proj.w": (4 * D, D), p + "mlp.c_proj.b": (D,)})
    return s


def gpt2(P, ids, targets):
    x = P["wte"][ids] + P["wpe"][:S]
    for l in range(L):
        p = f"h.{l}."
        h = F.layer_norm(x, (D,), P[p + "ln_1.w"], P[p + "ln_1.b"], 1e-5)
        q, k, v = (h @ P[p + "attn.c_attn.w"] + P[p + "attn.c_attn.b"]).split(D, dim=2)
        q, k, v = (t.view(B, S, H, D // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D // H) ** 0.5
        att = att.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.softmax(att, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, S, D)
        x = x + o @ P[p + "attn.c_proj.w"] + P[p + "attn.c_proj.b"]
        h = F.layer_norm(x, (D,), P[p + "ln_2.w"], P[p + "ln_2.b"], 1e-5)
        h = F.gelu(h @ P[p + "mlp.c_fc.w"] + P[p + "mlp.c_fc.b"], approximate="tanh")
        x = x + h @ P[p + "mlp.c_proj.w"] + P[p + "mlp.c_proj.b"]
    x = F.layer_norm(x, (D,), P["ln_f.w"], P["ln_f.b"], 1e-5)
    logits = x @ P["wte"].T
    return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long())


def rel(got, ref):
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "mxfp8"])
def test_trainer_matches_pytorch(recipe):
    text = open(os.path.join(DATA, "tinyshakespeare.txt")).read()
    chars = sorted(set(text))
    assert len(chars) == V
    toks = np.array([chars.index(c) for c in text[:B * S + 1]], dtype=np.int32)
    ids = toks[:-1].reshape(B, S)
    targets = toks[1:].reshape(B, S)
    t = _core.Trainer({"text": os.path.join(DATA, "tinyshakespeare.txt"), "layers": L, "dim": D,
                       "heads": H, "batch": B, "seq": S, "recipe": recipe, "cores": 2,
                       "lr": 1e-3, "min_lr": 1e-3, "warmup": 0, "steps": 10, "clip": 1.0,
                       "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95})
    t.keep_gradients(True)
    sh = shapes()
    assert sorted(t.param_names) == sorted(sh)
    P = {n: torch.tensor(t.param(n).reshape(sh[n]), requires_grad=True) for n in sh}
    tol_logits, tol_loss, tol_grad, tol_steps = TOL[recipe]

    ref_logits, ref_loss = gpt2(P, torch.tensor(ids).long(), torch.tensor(targets))
    got = t.logits(ids).reshape(B, S, V)
    assert rel(got, ref_logits.detach().numpy()) <= tol_logits

    decay = [P[n] for n in sh if len(sh[n]) >= 2]
    no_decay = [P[n] for n in sh if len(sh[n]) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    errors = []
    for step in range(1, 11):
        m = t.step(ids, targets)
        opt.zero_grad()
        _, loss = gpt2(P, torch.tensor(ids).long(), torch.tensor(targets))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        if step == 1:
            assert abs(m["loss"] - loss.item()) <= tol_loss * loss.item()
            assert abs(m["grad_norm"] - norm.item()) <= tol_grad * norm.item()
            grads = t.gradients()
            # clip_grad_norm_ scaled P's grads: compare the unclipped ones.
            scale = min(1.0, 1.0 / (norm.item() + 1e-6))
            for n in sh:
                ref = P[n].grad.numpy().reshape(-1) / scale
                assert rel(grads[n], ref) <= tol_grad, (n, rel(grads[n], ref))
        opt.step()
        errors.append(abs(m["loss"] - loss.item()) / loss.item())
        assert m["updated"] and m["clip_scale"] <= 1.0
    assert max(errors) <= tol_steps, errors
    assert t.steps_done == 10
