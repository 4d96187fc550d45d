"""Row softmax in the public NKI style.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/softmax.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def softmax_kernel(x):
    """y[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max)), rows on partitions."""
    rows, d = x.shape
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    P = nl.tile_size.pmax
    for r in nl.affine_range((rows + P - 1) // P):
        n = min(P, rows - r * P)
        t = nl.load(x[r * P:r * P + n, :])
        neg_max = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=1, negate=True)
        e = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=total)
        inv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        nisa.tensor_scalar(dst=e, data=e, op0=nl.multiply, operand0=inv)
        nl.store(out[r * P:r * P + n, :], value=e)
    return out


def reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def main():
    x = np.random.default_rng(0).standard_normal((300, 1000), dtype=np.float32) * 3
    y = softmax_kernel(x)
    err = np.abs(y - reference(x)).max()
    assert err < 1e-5, err
    print(f"softmax: ok (max error {err:.1e}), {softmax_kernel.last['latency_us']:.2f} us")


if __name__ == "__main__":
    main()
