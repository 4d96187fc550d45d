"""Built-in kernels (tern._core.build_kernel) against PyTorch (Debian's
python3-torch) as the independent oracle: forward values in float64 and
backward kernels against autograd. Tolerances per dtype: fp32 results are
within a few FP32 ulps of float64 (1e-5 relative to the output's scale);
bf16 outputs carry their own rounding (2^-8 relative)."""
import numpy as np
import pytest

import torch  # python3-torch (scripts/setup.sh)

from tern import _core

TOL = {"fp32": 1e-5, "bf16": 2.0**-8}


def bf16(x):
    """Round float32 values to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def run(chip, name, inputs, **params):
    """Builds and runs kernel `name`; returns {output name: array}."""
    c = _core.load_chip(chip)
    sim = _core.Simulator(c)
    prog = _core.build_kernel(c, name, **params)
    sim.load(prog)
    for k, v in inputs.items():
        sim.write(k, np.ascontiguousarray(v, np.float32).ravel())
    sim.run()
    return sim, prog


def close(got, want, dtype, scale=None):
    want = want.detach().double().numpy() if hasattr(want, "detach") else np.asarray(want)
    got = np.asarray(got, np.float64).reshape(want.shape)
    s = np.abs(want).max() if scale is None else scale
    err = np.abs(got - want).max() / max(s, 1e-30)
    assert err <= TOL[dtype], f"max error {err:.3g} (relative to {s:.3g}) > {TOL[dtype]}"


def rng_normal(shape, seed, dtype, std=1.0):
    x = (np.random.default_rng(seed).standard_normal(shape) * std).astype(np.float32)
    return bf16(x) if dtype == "bf16" else x


@pytest.mark.parametrize("rows,dim,dtype,cores", [(200, 333, "fp32", 1), (130, 1000, "bf16", 2), (1, 1, "fp32", 1)])
def test_softmax_forward_and_backward_match_autograd(rows, dim, dtype, cores):
    x = rng_normal((rows, dim), 1, dtype, 3.0)
    dy = rng_normal((rows, dim), 2, dtype)
    sim, _ = run("trn3", "softmax", {"x": x}, rows=rows, dim=dim, dtype=dtype, cores=cores)
    y = sim.read("y").reshape(rows, dim)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = torch.softmax(xt, dim=-1)
    close(y, yt, dtype)
    # Backward from the kernel's own y (what a training step stores): autograd
    # at x for fp32; for bf16, PyTorch's softmax backward evaluated at the
    # kernel's rounded y (the kernel cannot know the unrounded y).
    sim, _ = run("trn3", "softmax_backward", {"dy": dy, "y": y}, rows=rows, dim=dim, dtype=dtype, cores=cores)
    dyt = torch.tensor(dy, dtype=torch.float64)
    if dtype == "fp32":
        (g,) = torch.autograd.grad(yt, xt, dyt)
    else:
        g = torch._softmax_backward_data(dyt, torch.tensor(y, dtype=torch.float64), -1, torch.float64)
    close(sim.read("dx"), g, dtype)


@pytest.mark.parametrize(
    "rows,vocab,dtype,chunk,cores",
    [(200, 65, "fp32", 2048, 1), (130, 5000, "fp32", 1024, 2), (64, 777, "bf16", 100, 1), (5, 3, "fp32", 2, 1)],
)
def test_cross_entropy_matches_torch_loss_and_autograd(rows, vocab, dtype, chunk, cores):
    x = rng_normal((rows, vocab), 3, dtype, 2.0)
    tg = np.random.default_rng(4).integers(0, vocab, rows)
    tg[::5] = -100  # PyTorch's default ignore_index
    sim, _ = run("trn3", "cross_entropy", {"logits": x, "targets": tg}, rows=rows, vocab=vocab,
                 dtype=dtype, chunk=chunk, cores=cores)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(tg, dtype=torch.long)
    per_token = torch.nn.functional.cross_entropy(xt, tt, reduction="none", ignore_index=-100)
    close(sim.read("loss"), per_token, "fp32")
    # The kernel's default grad_scale is 1/T: the gradient of sum(loss) / T.
    (g,) = torch.autograd.grad(per_token.sum() / rows, xt)
    close(sim.read("dlogits"), g, dtype)


@pytest.mark.parametrize("rows,dim,dtype,residual", [(130, 100, "fp32", False), (200, 768, "bf16", True)])
def test_norms_match_torch(rows, dim, dtype, residual):
    x = rng_normal((rows, dim), 5, dtype)
    r = rng_normal((rows, dim), 6, dtype)
    gamma = rng_normal((1, dim), 7, dtype)
    beta = rng_normal((1, dim), 8, dtype)
    inputs = {"x": x, "gamma": gamma}
    if residual:
        inputs["residual"] = r
    h = torch.tensor(x, dtype=torch.float64) + (torch.tensor(r, dtype=torch.float64) if residual else 0)
    if dtype == "bf16" and residual:
        h = torch.tensor(bf16((x + r).astype(np.float32)), dtype=torch.float64)  # h is stored in bf16
    sim, _ = run("trn3", "rmsnorm", inputs, rows=rows, dim=dim, dtype=dtype, residual=residual)
    g64 = torch.tensor(gamma, dtype=torch.float64)
    want = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * g64
    close(sim.read("y"), want, dtype)
    inputs["beta"] = beta
    sim, _ = run("trn3", "layernorm", inputs, rows=rows, dim=dim, dtype=dtype, residual=residual)
    want = torch.nn.functional.layer_norm(h, (dim,), g64[0], torch.tensor(beta[0], dtype=torch.float64), 1e-5)
    close(sim.read("y"), want, dtype)


@pytest.mark.parametrize("rows,dim,dtype,cores", [(130, 100, "fp32", 2), (256, 512, "bf16", 1)])
def test_rmsnorm_backward_matches_autograd(rows, dim, dtype, cores):
    h = rng_normal((rows, dim), 9, dtype)
    gamma = rng_normal((1, dim), 10, dtype)
    dy = rng_normal((rows, dim), 11, dtype)
    ht = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    gt = torch.tensor(gamma, dtype=torch.float64, requires_grad=True)
    rstd = torch.rsqrt((ht * ht).mean(-1, keepdim=True) + 1e-6)
    y = ht * gt * rstd
    dh, dg = torch.autograd.grad(y, (ht, gt), torch.tensor(dy, dtype=torch.float64))
    sim, _ = run("trn3", "rmsnorm_backward",
                 {"dy": dy, "h": h, "gamma": gamma, "rstd": rstd.detach().numpy().astype(np.float32)},
                 rows=rows, dim=dim, dtype=dtype, cores=cores)
    close(sim.read("dh"), dh, dtype)
    close(sim.read("dgamma_parts").reshape(cores, dim).sum(0), dg[0], "fp32" if dtype == "fp32" else "bf16")


def test_adamw_matches_torch_optimizer():
    rows, cols, steps = 130, 100, 3
    p = rng_normal((rows, cols), 12, "fp32")
    pt = torch.tensor(p, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.AdamW([pt], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t in range(1, steps + 1):
        g = rng_normal((rows, cols), 100 + t, "fp32")
        pt.grad = torch.tensor(g)
        opt.step()
        sim, _ = run("trn3", "adamw", {"param": p, "grad": g, "m": m, "v": v}, rows=rows, dim=cols,
                     dtype="fp32", lr=0.01, weight_decay=0.1, step=t)
        p, m, v = (sim.read(n).reshape(rows, cols) for n in ("param_out", "m_out", "v_out"))
        close(p, pt.detach().double(), "fp32")
    close(sim.read("param_bf16"), torch.tensor(bf16(p)), "fp32")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "scale"])
def test_elementwise_matches_torch(op):
    rows, cols = 130, 2100
    a = rng_normal((rows, cols), 20, "bf16")
    b = rng_normal((rows, cols), 21, "bf16")
    inputs = {"a": a} if op == "scale" else {"a": a, "b": b}
    sim, _ = run("trn3", "elementwise", inputs, rows=rows, dim=cols, op=op, alpha=0.375, dtype="bf16", cores=2)
    at, bt = torch.tensor(a), torch.tensor(b)
    want = {"add": at + bt, "sub": at - bt, "mul": at * bt, "scale": at * 0.375}[op]
    # PyTorch in bf16 rounds the FP32 result once, as the kernel does: exact.
    want = want.to(torch.bfloat16).float().numpy()
    assert np.array_equal(sim.read("out").reshape(rows, cols), want)


def test_reduce_and_clip_match_torch_clip_grad_norm():
    """Global-norm clipping of three gradient tensors: the per-tensor
    sum-of-squares partials (reduce --all), then clip each tensor."""
    shapes = [(300, 200), (1, 77), (130, 513)]
    grads = [rng_normal(s, 30 + i, "fp32", 2.0) for i, s in enumerate(shapes)]
    parts = []
    for g in grads:
        sim, _ = run("trn3", "reduce", {"x": g}, rows=g.shape[0], dim=g.shape[1], op="sumsq", all=True,
                     dtype="fp32", cores=2)
        parts.extend(sim.read("out"))
    ts = [torch.tensor(g, dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(ts, grads):
        t.grad = torch.tensor(g, dtype=torch.float64)
    norm = torch.nn.utils.clip_grad_norm_(ts, max_norm=1.5)
    for t, g in zip(ts, grads):
        sim, _ = run("trn3", "clip_by_global_norm", {"grad": g, "sumsq_parts": np.array(parts)},
                     rows=g.shape[0], dim=g.shape[1], parts=len(parts), max_norm=1.5, dtype="fp32")
        close(sim.read("norm"), norm.reshape(1), "fp32")
        close(sim.read("grad_out"), t.grad, "fp32")


GLU_ACTS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_glu_forward_and_backward_match_autograd(act, dtype):
    rows, cols = 130, 2100
    g = rng_normal((rows, cols), 40, dtype, 2.0)
    u = rng_normal((rows, cols), 41, dtype)
    d = rng_normal((rows, cols), 42, dtype)
    gt = torch.tensor(g, dtype=torch.float64, requires_grad=True)
    ut = torch.tensor(u, dtype=torch.float64, requires_grad=True)
    out = GLU_ACTS[act](gt) * ut
    sim, _ = run("trn3", "glu", {"gate": g, "up": u}, rows=rows, dim=cols, act=act, dtype=dtype, cores=2)
    # Per element: the output's own rounding (bf16) or FP32 libm error.
    tol = 2.0**-8 if dtype == "bf16" else 1e-5
    err = np.abs(sim.read("out").reshape(rows, cols) - out.detach().numpy()) / (1 + np.abs(out.detach().numpy()))
    assert err.max() <= tol
    dg, du = torch.autograd.grad(out, (gt, ut), torch.tensor(d, dtype=torch.float64))
    sim, _ = run("trn3", "glu_backward", {"dout": d, "gate": g, "up": u}, rows=rows, dim=cols, act=act,
                 dtype=dtype, cores=2)
    for name, want in (("dgate", dg), ("dup", du)):
        w = want.numpy()
        err = np.abs(sim.read(name).reshape(rows, cols) - w) / (1 + np.abs(w))
        assert err.max() <= tol, f"{name}: {err.max():.3g}"


@pytest.mark.parametrize("rows,dim,dtype,cores", [(130, 100, "fp32", 2), (256, 768, "bf16", 1)])
def test_layernorm_backward_matches_autograd(rows, dim, dtype, cores):
    h = rng_normal((rows, dim), 50, dtype, 2.0)
    gamma = rng_normal((1, dim), 51, dtype)
    beta = rng_normal((1, dim), 52, dtype)
    dy = rng_normal((rows, dim), 53, dtype)
    ht = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    gt = torch.tensor(gamma[0], dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(beta[0], dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.layer_norm(ht, (dim,), gt, bt, 1e-5)
    dh, dg, db = torch.autograd.grad(y, (ht, gt, bt), torch.tensor(dy, dtype=torch.float64))
    # mean and rstd as the forward kernel saves them.
    sim, _ = run("trn3", "layernorm", {"x": h, "gamma": gamma, "beta": beta}, rows=rows, dim=dim, dtype=dtype)
    mean, rstd = sim.read("mean"), sim.read("rstd")
    sim, _ = run("trn3", "layernorm_backward", {"dy": dy, "h": h, "gamma": gamma, "mean": mean, "rstd": rstd},
                 rows=rows, dim=dim, dtype=dtype, cores=cores)
    close(sim.read("dh"), dh, dtype)
    close(sim.read("dgamma_parts").reshape(cores, dim).sum(0), dg, "fp32")
    close(sim.read("dbeta_parts").reshape(cores, dim).sum(0), db, "fp32")


def test_cast_to_bf16_and_amax_match_torch():
    rows, cols = 130, 4100
    x = rng_normal((rows, cols), 60, "fp32", 3.0)
    sim, _ = run("trn3", "cast", {"x": x, "scale": np.array([0.5], np.float32)}, rows=rows, dim=cols,
                 **{"in": "fp32", "out": "bf16", "cores": 2})
    xt = torch.tensor(x)
    assert np.array_equal(sim.read("y").reshape(rows, cols), (xt * 0.5).to(torch.bfloat16).float().numpy())
    assert sim.read("amax").max() == xt.abs().max().item()


@pytest.mark.parametrize("trans_a,trans_b", [(True, False), (False, False), (True, True), (False, True)])
def test_batched_matmul_layouts_match_torch_bmm(trans_a, trans_b):
    nb, m, n, k = 3, 130, 200, 260
    a = rng_normal((nb, m, k), 70, "bf16")
    b = rng_normal((nb, k, n), 71, "bf16")
    inputs = {
        "at" if trans_a else "a": (a.transpose(0, 2, 1) if trans_a else a).reshape(-1),
        "bt" if trans_b else "b": (b.transpose(0, 2, 1) if trans_b else b).reshape(-1),
    }
    sim, _ = run("trn3", "matmul", inputs, m=m, n=n, k=k, batch=nb, trans_a=trans_a, trans_b=trans_b, cores=2)
    want = torch.bmm(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    # bf16 products are exact in FP32; the FP32 accumulation of K terms.
    close(sim.read("c").reshape(nb, m, n), want, "fp32", scale=np.abs(want.numpy()).max() * 10)


def test_matmul_amax_epilogue_matches_torch():
    """amax per 512-column output tile row; its max is the tensor's amax."""
    m, n, k = 200, 1100, 300
    at = rng_normal((k, m), 80, "bf16")
    b = rng_normal((k, n), 81, "bf16")
    sim, _ = run("trn3", "matmul", {"at": at, "b": b, "qscale": np.array([0.25], np.float32)}, m=m, n=n, k=k,
                 epilogue="gelu,amax,qscale", out="bf16")
    y = torch.nn.functional.gelu(torch.tensor(at, dtype=torch.float64).T @ torch.tensor(b, dtype=torch.float64))
    amax = sim.read("amax").reshape(m, 3)
    for t in range(3):
        want = y[:, 512 * t:512 * (t + 1)].abs().amax(dim=1).numpy()
        assert np.allclose(amax[:, t], want, rtol=1e-5, atol=1e-6)
    close(sim.read("c").reshape(m, n), y * 0.25, "bf16")
