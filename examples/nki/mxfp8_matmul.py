"""An MXFP8 matmul on trn3 in the public NKI style: BF16 tiles quantized on
chip with quantize_mx (groups of 8 partitions x 4 values), multiplied with
nc_matmul_mx.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/mxfp8_matmul.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from tern import _core


@nki.jit(platform_target="trn3")
def mxfp8_matmul(lhsT, rhs):
    """result[M, N] = lhsT[K, M].T @ rhs[K, N] with M <= 128, N <= 512 and K a
    multiple of 512, both operands quantized to MXFP8 E4M3 on chip."""
    K, M = lhsT.shape
    _, N = rhs.shape
    P = nl.tile_size.pmax
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(K // (4 * P)):
        k0 = kt * 4 * P
        # Partition p holds contraction rows k0 + 4p + j, j = 0..3, for every column.
        a_src = nl.load(lhsT.ap([[4 * M, P], [1, M], [M, 4]], offset=k0 * M))
        b_src = nl.load(rhs.ap([[4 * N, P], [1, N], [N, 4]], offset=k0 * N))
        a = nl.ndarray((P, M), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        a_scale = nl.ndarray((P // 8, M), dtype=nl.uint8, buffer=nl.sbuf)
        b = nl.ndarray((P, N), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        b_scale = nl.ndarray((P // 8, N), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=a, src=a_src.reshape((P, 4 * M)), dst_scale=a_scale)
        nisa.quantize_mx(dst=b, src=b_src.reshape((P, 4 * N)), dst_scale=b_scale)
        nisa.nc_matmul_mx(dst=acc, stationary=a, moving=b, stationary_scale=a_scale, moving_scale=b_scale)
    nl.store(result, value=nl.copy(acc))
    return result


def reference(lhsT, rhs):
    """Host MX quantization (trn3 scales) of both operands, then FP32
    accumulation in contraction order, one rounding per step."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    a = _core.mx_roundtrip_columns(lhsT.reshape(-1), K, M, False).reshape(K, M)
    b = _core.mx_roundtrip_columns(rhs.reshape(-1), K, N, False).reshape(K, N)
    out = np.zeros((M, N), dtype=np.float32)
    for k in range(K):
        out = (out + np.outer(a[k], b[k]).astype(np.float32)).astype(np.float32)
    return out


def bf16_values(shape, seed, scale=1.0):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def main():
    a, b = bf16_values((1024, 128), 1, 4.0), bf16_values((1024, 512), 2, 0.01)
    c = mxfp8_matmul(nki.typed(a, nl.bfloat16), nki.typed(b, nl.bfloat16))
    assert np.array_equal(c, reference(a, b))
    exact = a.T.astype(np.float64) @ b.astype(np.float64)
    rel = np.abs(c - exact).max() / np.abs(exact).max()
    print(f"mxfp8 matmul: ok, bit-exact against the host MX reference; {rel:.1e} relative to the exact "
          f"product; {mxfp8_matmul.last['latency_us']:.2f} us")


if __name__ == "__main__":
    main()
