"""A layer norm in the legacy NKI generation (`import neuronxcc.nki`), the
style of SDK 2.20-2.26 tutorials: nl.mgrid indices, masks for the last
partial tile, tile arithmetic and nl.* tile functions. tern.nki.install()
makes the legacy imports resolve to tern.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/legacy_layernorm.py
"""
import math

import numpy as np

import tern.nki

tern.nki.install()

import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


@nki.jit
def layernorm_rows(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over each row of x [R, F]."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows, cols = x.shape
    p = nl.tile_size.pmax
    ip, jf = nl.mgrid[0:p, 0:cols]
    i0, jw = nl.mgrid[0:1, 0:cols]
    w = nl.load(weight.reshape((1, cols))[i0, jw]).broadcast_to((p, cols))
    b = nl.load(bias.reshape((1, cols))[i0, jw]).broadcast_to((p, cols))
    for t in nl.affine_range(math.ceil(rows / p)):
        keep = t * p + ip < rows  # the last tile may be partial
        tile = nl.load(x[t * p + ip, jf], mask=keep)
        mean = nl.mean(tile, axis=1, mask=keep)
        centered = nl.subtract(tile, mean, mask=keep)
        var = nl.mean(nl.square(centered, mask=keep), axis=1, mask=keep)
        y = centered * nl.rsqrt(var + eps) * w + b
        nl.store(out[t * p + ip, jf], value=y, mask=keep)
    return out


def reference(x, weight, bias, eps):
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    return (x64 - mu) / np.sqrt(x64.var(axis=1, keepdims=True) + eps) * weight + bias


def main():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 256), dtype=np.float32)
    w = rng.standard_normal(256, dtype=np.float32)
    b = rng.standard_normal(256, dtype=np.float32)
    y = layernorm_rows(x, w, b, 1e-5)
    err = np.abs(y - reference(x, w, b, 1e-5)).max()
    assert err < 1e-4, err
    print(f"legacy layernorm [300, 256]: max error {err:.2e}, {layernorm_rows.last['latency_us']:.2f} us simulated")


if __name__ == "__main__":
    main()
