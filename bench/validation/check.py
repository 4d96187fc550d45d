"""Functional check of the LayerNorm and Mamba kernels on trn1 against numpy
(float64 references, fp32 tolerances), on small shapes.

    PYTHONPATH=build/python /usr/bin/python3 bench/validation/check.py
"""
import os
import sys
import time

import numpy as np

import tern.nki

tern.nki.install()

import neuronxcc.nki as nki  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels"))
import layernorm as layernorm_kernels  # noqa: E402
import mamba as mamba_kernels  # noqa: E402

TARGET = "trn1"


def layernorm_ref(x, eps, gamma, beta):
    x = x.astype(np.float64)
    mu = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def mamba_ref(delta, u, A, B, C):
    d, uu = delta.astype(np.float64), u.astype(np.float64)
    decay = np.exp(d[:, :, None, :] * A[None, :, :, None])          # [b, c, s, t]
    drive = (d * uu)[:, :, None, :] * B[:, None, :, :]
    h = np.zeros(decay.shape[:-1])
    out = np.zeros(d.shape)
    for t in range(d.shape[-1]):
        h = decay[..., t] * h + drive[..., t]
        out[..., t] = (h * C[:, None, :, t]).sum(axis=2)
    return out


def run(kernel, *args):
    return nki.jit(kernel.fn, platform_target=TARGET)(*args)


def close(name, got, want, rtol=1e-4, atol_frac=1e-5):
    atol = atol_frac * float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    ok = got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=atol)
    print(f"{'ok ' if ok else 'BAD'} {name}: max abs err {err:.3e} (atol {atol:.1e}, rtol {rtol:.0e})")
    assert ok, name
    return ok


def main():
    rng = np.random.default_rng(7)
    t0 = time.time()
    # rows 300: a partial last row tile; cols 700: a partial bn_stats chunk.
    for rows, cols in [(300, 1000), (128, 512), (200, 700)]:
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 3 + 1
        g = rng.standard_normal(cols).astype(np.float32)
        b = rng.standard_normal(cols).astype(np.float32)
        want = layernorm_ref(x, 1e-5, g, b)
        for k in (layernorm_kernels.layernorm_v1, layernorm_kernels.layernorm_v2):
            close(f"{k.__name__} ({rows}, {cols})", run(k, x, 1e-5, g, b), want)

    for batch, chans, seqlen, states in [(1, 256, 512, 16), (2, 256, 1024, 4), (1, 128, 2048, 2)]:
        delta = rng.uniform(0.01, 0.2, (batch, chans, seqlen)).astype(np.float32)
        u = rng.standard_normal((batch, chans, seqlen)).astype(np.float32)
        A = -rng.uniform(0.2, 2.0, (chans, states)).astype(np.float32)
        B = rng.standard_normal((batch, states, seqlen)).astype(np.float32)
        C = rng.standard_normal((batch, states, seqlen)).astype(np.float32)
        want = mamba_ref(delta, u, A, B, C)
        for k in (mamba_kernels.mamba_v1, mamba_kernels.mamba_v2, mamba_kernels.mamba_v3,
                  mamba_kernels.mamba_v2_inplace):
            close(f"{k.__name__} (batch {batch}, channels {chans}, seq {seqlen}, state {states})",
                  run(k, delta, u, A, B, C), want)
        # The tile-placement knob must not change any value.
        mamba_kernels.RELEASE_CHANNEL_TILES = True
        for k in (mamba_kernels.mamba_v2, mamba_kernels.mamba_v3, mamba_kernels.mamba_v2_inplace):
            close(f"{k.__name__} RELEASE_CHANNEL_TILES (batch {batch}, channels {chans}, seq {seqlen}, "
                  f"state {states})", run(k, delta, u, A, B, C), want)
        mamba_kernels.RELEASE_CHANNEL_TILES = False
    print(f"all checks passed in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
