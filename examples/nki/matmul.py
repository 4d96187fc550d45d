"""Matmul in stages, in the public NKI style (the NKI matmul tutorial's
progression): a single tile, then tiled over M, N and K.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/matmul.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def matmul_single_tile(lhsT, rhs):
    """[K=128, M=128].T @ [K=128, N=512] in one nc_matmul."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(lhsT)
    b = nl.load(rhs)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    nl.store(result, value=nl.copy(acc))
    return result


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Any K, M, N that are multiples of 128, 128 and 512: tiles of
    [128 x 128] stationary and [128 x 512] moving, accumulating over K in PSUM."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                a = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                b = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)  # accumulates after the first
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(acc))
    return result


def reference(lhsT, rhs):
    """FP32 accumulation in contraction order, one rounding per step, as the
    Tensor engine does (bf16-representable inputs make each product exact)."""
    out = np.zeros((lhsT.shape[1], rhs.shape[1]), dtype=np.float32)
    for k in range(lhsT.shape[0]):
        out = (out + np.outer(lhsT[k], rhs[k]).astype(np.float32)).astype(np.float32)
    return out


def bf16_values(shape, seed):
    """Random FP32 values with 8 significant bits (exactly representable in BF16)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def main():
    a, b = bf16_values((128, 128), 1), bf16_values((128, 512), 2)
    assert np.array_equal(matmul_single_tile(a, b), reference(a, b))
    print(f"single tile: ok, {matmul_single_tile.last['latency_us']:.2f} us simulated")
    a, b = bf16_values((256, 256), 3), bf16_values((256, 1024), 4)
    assert np.array_equal(matmul_tiled(a, b), reference(a, b))
    print(f"tiled: ok, {matmul_tiled.last['latency_us']:.2f} us simulated")


if __name__ == "__main__":
    main()
