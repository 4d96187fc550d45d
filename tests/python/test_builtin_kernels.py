"""The built-in C++ kernels (tern._core.matmul_kernel with fused epilogues)
against numpy in FP64: tolerances per output dtype, odd shapes included."""
import math

import numpy as np
import pytest

from tern import _core

_erf = np.vectorize(math.erf)

ACTS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
}

# |got - want| <= tol * (1 + |want|): FP32 evaluation error of the chain, or
# the output rounding (bf16: 8 significant bits; fp8 inputs are exact in the
# reference, which multiplies the values the kernel was given).
TOL = {"fp32": 1e-4, "bf16": 2.0**-7}


def bf16(x):
    """Round float32 values to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def run(chip, m, n, k, dtype, out, epilogue, seed=0):
    rng = np.random.default_rng(seed)
    at = bf16(rng.standard_normal((k, m)).astype(np.float32))
    b = bf16(rng.standard_normal((k, n)).astype(np.float32))
    bias = rng.standard_normal((1, n)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    sim = _core.Simulator(_core.load_chip(chip))
    sim.load(_core.matmul_kernel(_core.load_chip(chip), m, n, k, dtype, out, epilogue))
    sim.write("at", at)
    sim.write("b", b)
    steps = epilogue.split(",") if epilogue else []
    if "bias" in steps:
        sim.write("bias", bias)
    if "residual" in steps:
        sim.write("residual", res)
    sim.run()
    got = sim.read("c").reshape(m, n)
    y = at.astype(np.float64).T @ b.astype(np.float64)
    for s in steps:
        if s.startswith("scale="):
            y = y * float(s[6:])
        elif s == "bias":
            y = y + bias
        elif s == "residual":
            y = y + res
        else:
            y = ACTS[s](y)
    return got, y


@pytest.mark.parametrize(
    "chip,m,n,k,out,epilogue",
    [
        ("trn3", 128, 512, 128, "fp32", "bias,gelu"),
        ("trn3", 200, 300, 260, "bf16", "scale=0.125,bias,gelu_tanh,residual"),
        ("trn2", 77, 45, 130, "fp32", "silu"),
        ("trn1", 130, 70, 64, "bf16", "bias,relu,residual"),
        ("trn3", 1, 1, 1, "fp32", "scale=3,relu"),
    ],
)
def test_fused_epilogue_matches_numpy(chip, m, n, k, out, epilogue):
    got, want = run(chip, m, n, k, "bf16", out, epilogue)
    err = np.abs(got - want) / (1.0 + np.abs(want))
    assert err.max() <= TOL[out], f"max relative error {err.max():.3g} > {TOL[out]}"


def test_fused_equals_matmul_then_epilogue_kernel():
    chip = _core.load_chip("trn3")
    m, n, k = 96, 200, 128
    fused, _ = run("trn3", m, n, k, "bf16", "fp32", "gelu")
    plain, _ = run("trn3", m, n, k, "bf16", "fp32", "")
    sim = _core.Simulator(chip)
    sim.load(_core.epilogue_kernel(chip, m, n, "gelu"))
    sim.write("x", plain)
    sim.run()
    assert np.array_equal(sim.read("y").reshape(m, n).view(np.uint32), fused.view(np.uint32))


def test_bad_epilogue_is_a_clear_error():
    with pytest.raises(Exception, match="epilogue step 'gleu'"):
        _core.matmul_kernel(_core.load_chip("trn3"), 8, 8, 8, epilogue="gleu")


@pytest.mark.parametrize(
    "rows,dim,dtype,residual,cores",
    [(256, 512, "bf16", False, 1), (300, 1000, "bf16", True, 2), (129, 77, "fp32", True, 1), (1, 1, "fp32", False, 1)],
)
def test_rmsnorm_matches_numpy(rows, dim, dtype, residual, cores):
    chip = _core.load_chip("trn3")
    rng = np.random.default_rng(5)
    rnd = bf16 if dtype == "bf16" else (lambda v: np.asarray(v, np.float32))
    x = rnd(rng.standard_normal((rows, dim)).astype(np.float32))
    res = rnd(rng.standard_normal((rows, dim)).astype(np.float32))
    gamma = rnd((1.0 + 0.1 * rng.standard_normal((1, dim))).astype(np.float32))
    sim = _core.Simulator(chip)
    sim.load(_core.rmsnorm_kernel(chip, rows, dim, dtype, 1e-6, residual, cores))
    sim.write("x", x)
    sim.write("gamma", gamma)
    if residual:
        sim.write("residual", res)
    sim.run()
    h = rnd(x + res) if residual else x
    h64 = h.astype(np.float64)
    rstd = 1.0 / np.sqrt((h64**2).mean(axis=1, keepdims=True) + 1e-6)
    want = h64 * rstd * gamma
    got = sim.read("y").reshape(rows, dim)
    tol = TOL[dtype]
    assert np.max(np.abs(got - want) / (1.0 + np.abs(want))) <= tol
    assert np.allclose(sim.read("rstd").reshape(rows, 1), rstd, rtol=1e-5)
    if residual:
        assert np.array_equal(sim.read("h").reshape(rows, dim), h)


@pytest.mark.parametrize("rows,cols,grad,step,cores", [(128, 1024, "fp32", 1, 1), (300, 700, "bf16", 50, 2), (1, 3, "fp32", 7, 1)])
def test_adamw_matches_pytorch_formula(rows, cols, grad, step, cores):
    """torch.optim.AdamW (single tensor) in FP64 numpy: decoupled decay, then
    the bias-corrected update."""
    chip = _core.load_chip("trn3")
    lr, b1, b2, eps, wd = 3e-4, 0.9, 0.95, 1e-8, 0.1
    rng = np.random.default_rng(9)
    p = rng.standard_normal((rows, cols)).astype(np.float32)
    g = (0.01 * rng.standard_normal((rows, cols))).astype(np.float32)
    if grad == "bf16":
        g = bf16(g)
    m = (0.001 * rng.standard_normal((rows, cols))).astype(np.float32)
    v = (1e-5 * np.abs(rng.standard_normal((rows, cols)))).astype(np.float32)
    sim = _core.Simulator(chip)
    sim.load(_core.adamw_kernel(chip, rows, cols, grad, lr, b1, b2, eps, wd, step, cores))
    for name, x in (("param", p), ("grad", g), ("m", m), ("v", v)):
        sim.write(name, x)
    sim.run()
    f = lambda a: np.float64(np.float32(a))  # the FP32 hyperparameters the kernel was given
    lr, b1, b2, eps, wd = map(f, (lr, b1, b2, eps, wd))
    m2 = b1 * m + (1 - b1) * g.astype(np.float64)
    v2 = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
    denom = np.sqrt(v2) / math.sqrt(1 - b2**step) + eps
    p2 = p * (1 - lr * wd) - lr / (1 - b1**step) * m2 / denom
    got = sim.read("param_out").reshape(rows, cols)
    assert np.max(np.abs(got - p2) / (1 + np.abs(p2))) < 1e-6
    scale = b1 * np.abs(m) + (1 - b1) * np.abs(g)
    assert np.all(np.abs(sim.read("m_out").reshape(rows, cols) - m2) <= 1e-6 * scale + 1e-30)
    assert np.allclose(sim.read("v_out").reshape(rows, cols), v2, rtol=1e-6, atol=0)
    assert np.array_equal(sim.read("param_bf16").reshape(rows, cols), bf16(got))
