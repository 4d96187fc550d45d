"""The whole training step compiled once and run step after step on the
simulated chip (tern.graph: backward, the AdamW step in the graph, a
Session that keeps weights and optimizer state on the device), against
PyTorch (python3-torch) training the same FP32 MLP with torch.optim.AdamW.
Both sides compute in FP32; the losses agree to 1e-5 relative and the
weights after three steps to 1e-4 of their largest magnitude."""
import numpy as np
import torch
import torch.nn.functional as F

from tern import graph as tg


def test_mlp_adamw_steps_on_the_device_match_torch():
    rng = np.random.default_rng(5)
    N, D, Hd, C = 128, 64, 128, 10
    P = {"w1": rng.standard_normal((D, Hd)) * 0.2, "b1": rng.standard_normal(Hd) * 0.1,
         "w2": rng.standard_normal((Hd, C)) * 0.2}
    P = {k: v.astype(np.float32) for k, v in P.items()}
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = rng.integers(0, C, size=N).astype(np.int32)

    g = tg.Graph("mlp")
    T = {k: g.param(k, list(v.shape), "fp32") for k, v in P.items()}
    tx, ty = g.input("x", [N, D], "fp32"), g.input("y", [N], "int32")
    h = g.gelu(g.add(g.matmul(tx, T["w1"]), T["b1"]))
    loss = g.cross_entropy(g.matmul(h, T["w2"]), ty)
    g.mark_output(loss)
    grads = g.backward(loss, list(T.values()))
    start = g.adamw(grads, beta1=0.9, beta2=0.999, eps=1e-8)
    assert start["scalars"] == "adamw.scalars" and start["master"] == {}  # fp32: own masters
    prog = g.compile("trn3", cores=2)
    assert prog.executable.kernels.count("adamw") == 1
    s = prog.session()
    for k, v in P.items():
        s.write(k, v)
    for z in start["zeros"]:
        s.fill(z, 0.0)
    s.write("x", x)
    s.write("y", y)

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    opt = torch.optim.AdamW(tp.values(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.05)
    for step in range(1, 4):
        outs, ns, events = s.step({"adamw.scalars": tg.adamw_scalars(1e-2, 0.05, 0.9, 0.999,
                                                                     step)})
        assert ns > 0 and events[-1]["kernel"] == "adamw"
        opt.zero_grad()
        hh = F.gelu(torch.tensor(x) @ tp["w1"] + tp["b1"])
        want = F.cross_entropy(hh @ tp["w2"], torch.tensor(y, dtype=torch.long))
        want.backward()
        opt.step()
        assert abs(float(outs[loss.name]) - want.item()) <= 1e-5 * want.item(), step
    assert s.steps == 3
    for k in P:
        got, ref = s.read(k), tp[k].detach().numpy()
        assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref)), k


def test_recipes_rewrite_the_matmuls():
    g = tg.Graph("lin")
    x, w = g.input("x", [64, 128], "bf16"), g.param("w", [128, 256], "bf16")
    g.mark_output(g.matmul(x, w))
    for recipe, fmt in (("mxfp8", "mxfp8_e4m3"), ("fp8-hybrid", "fp8_e4m3")):
        text = str(g.autocast(recipe))
        assert f"quant_a = {fmt}" in text and f"quant_b = {fmt}" in text, text
    assert "quant_policy = trn3" in str(g.autocast("mxfp8", mx_policy="trn3"))
