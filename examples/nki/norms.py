"""RMSNorm and LayerNorm in the public NKI style (rows on partitions).

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/norms.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def rmsnorm_kernel(x, gamma, eps=1e-6):
    """y = x / sqrt(mean(x^2) + eps) * gamma for x [R, D], gamma [1, D]."""
    rows, d = x.shape
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    P = nl.tile_size.pmax
    g = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.ap([[0, P], [1, d]]))  # gamma broadcast to every partition
    for r in nl.affine_range((rows + P - 1) // P):
        n = min(P, rows - r * P)
        t = nl.load(x[r * P:r * P + n, :])
        sq = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        ssum = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ssum)
        rstd = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        # 1 / sqrt(sum / d + eps)
        nisa.tensor_scalar(dst=rstd, data=ssum, op0=nl.multiply, operand0=1.0 / d, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=g[0:n, :], op=nl.multiply)
        nl.store(out[r * P:r * P + n, :], value=y)
    return out


@nki.jit
def layernorm_kernel(x, gamma, beta, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta, with bn_stats / bn_aggr."""
    rows, d = x.shape
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    P, F = nl.tile_size.pmax, nl.tile_size.bn_stats_fmax
    g = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
    bt = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.ap([[0, P], [1, d]]))
    nisa.dma_copy(dst=bt, src=beta.ap([[0, P], [1, d]]))
    chunks = (d + F - 1) // F
    for r in nl.affine_range((rows + P - 1) // P):
        n = min(P, rows - r * P)
        t = nl.load(x[r * P:r * P + n, :])
        stats = nl.ndarray((n, nl.tile_size.bn_stats_dim * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(chunks):
            w = min(F, d - c * F)
            nisa.bn_stats(dst=stats[:, c * 6:(c + 1) * 6], data=t[:, c * F:c * F + w])
        mv = nl.ndarray((n, nl.tile_size.bn_aggr_dim), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        rstd = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=mv[:, 1:2], op0=nl.add, operand0=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=g[0:n, :], op=nl.multiply)
        nisa.tensor_tensor(dst=y, data1=y, data2=bt[0:n, :], op=nl.add)
        nl.store(out[r * P:r * P + n, :], value=y)
    return out


def rmsnorm_ref(x, g, eps=1e-6):
    x = x.astype(np.float64)
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * g).astype(np.float32)


def layernorm_ref(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return ((x - mu) / np.sqrt(var + eps) * g + b).astype(np.float32)


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 768), dtype=np.float32) * 2 + 0.5
    g = rng.standard_normal((1, 768), dtype=np.float32)
    b = rng.standard_normal((1, 768), dtype=np.float32)
    y = rmsnorm_kernel(x, g)
    err = np.abs(y - rmsnorm_ref(x, g)).max()
    assert err < 1e-4, err
    print(f"rmsnorm: ok (max error {err:.1e}), {rmsnorm_kernel.last['latency_us']:.2f} us")
    y = layernorm_kernel(x, g, b)
    err = np.abs(y - layernorm_ref(x, g, b)).max()
    assert err < 1e-4, err
    print(f"layernorm: ok (max error {err:.1e}), {layernorm_kernel.last['latency_us']:.2f} us")


if __name__ == "__main__":
    main()
