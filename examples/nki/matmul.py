"""Matmul in stages, in the public NKI style (the progression of the NKI
matmul tutorial), each stage checked against numpy, and a benchmark of the
stages on a large shape in timing-only mode:

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/matmul.py
    PYTHONPATH=build/python /usr/bin/python3 examples/nki/matmul.py --benchmark

All stages compute result[M, N] = lhsT[K, M].T @ rhs[K, N] in FP32 PSUM.
"""
import argparse

import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def matmul_single_tile(lhsT, rhs):
    """Stage 1: one [128 x 128] x [128 x 512] tile in one nc_matmul."""
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
    """Stage 2: tiled over M, N and K; both tiles loaded in the inner loop
    (M, N, K multiples of 128, 512 and 128)."""
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


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """Stage 3: the lhsT tiles of a row block are loaded once, not per N tile."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        a = [nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM]) for k in range(K // TK)]
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                b = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a[k], moving=b)
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(acc))
    return result


@nki.jit
def matmul_block_free(lhsT, rhs, n_block=4):
    """Stage 4: a block of N tiles per rhs load (one wide DMA per K tile), one
    PSUM accumulator per N tile of the block."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    BN = TN * n_block
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        a = [nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM]) for k in range(K // TK)]
        for nb in nl.affine_range(N // BN):
            acc = [nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum) for _ in range(n_block)]
            for k in nl.affine_range(K // TK):
                b = nl.load(rhs[k * TK:(k + 1) * TK, nb * BN:(nb + 1) * BN])
                for j in range(n_block):
                    nisa.nc_matmul(dst=acc[j], stationary=a[k], moving=b[:, j * TN:(j + 1) * TN])
            for j in range(n_block):
                n0 = nb * BN + j * TN
                nl.store(result[m * TM:(m + 1) * TM, n0:n0 + TN], value=nl.copy(acc[j]))
            del acc  # the accumulators go back to PSUM before the next block takes new ones
    return result


@nki.jit
def matmul_optimized(lhsT, rhs, m_block=2, n_block=4):
    """Stage 5: blocks of M and N tiles share every load (m_block x n_block
    PSUM accumulators), K innermost; each loaded tile is released as soon as
    its matmuls are issued, so the next K step's loads overlap them (double
    buffering), and evacuation alternates Vector and Scalar."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    BM, BN = TM * m_block, TN * n_block
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for nb in nl.affine_range(N // BN):
        for mb in nl.affine_range(M // BM):
            acc = [[nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum) for _ in range(n_block)]
                   for _ in range(m_block)]
            for k in nl.affine_range(K // TK):
                a = nl.load(lhsT[k * TK:(k + 1) * TK, mb * BM:(mb + 1) * BM])
                b = nl.load(rhs[k * TK:(k + 1) * TK, nb * BN:(nb + 1) * BN])
                for i in range(m_block):
                    for j in range(n_block):
                        nisa.nc_matmul(dst=acc[i][j], stationary=a[:, i * TM:(i + 1) * TM],
                                       moving=b[:, j * TN:(j + 1) * TN])
            for i in range(m_block):
                for j in range(n_block):
                    out = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.sbuf)
                    engine = nisa.vector_engine if (i + j) % 2 == 0 else nisa.scalar_engine
                    nisa.tensor_copy(dst=out, src=acc[i][j], engine=engine)
                    m0, n0 = mb * BM + i * TM, nb * BN + j * TN
                    nl.store(result[m0:m0 + TM, n0:n0 + TN], value=out)
            del acc  # the accumulators go back to PSUM before the next block takes new ones
    return result


STAGES = [matmul_tiled, matmul_hoisted, matmul_block_free, matmul_optimized]


def reference(lhsT, rhs):
    """FP32 accumulation in contraction order, one rounding per step, as the
    Tensor engine does (BF16-representable inputs make each product exact)."""
    out = np.zeros((lhsT.shape[1], rhs.shape[1]), dtype=np.float32)
    for k in range(lhsT.shape[0]):
        out = (out + np.outer(lhsT[k], rhs[k]).astype(np.float32)).astype(np.float32)
    return out


def bf16_values(shape, seed):
    """Random FP32 values with 8 significant bits (exactly representable in BF16)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def check():
    a, b = bf16_values((128, 128), 1), bf16_values((128, 512), 2)
    assert np.array_equal(matmul_single_tile(a, b), reference(a, b))
    print(f"{'matmul_single_tile':20s} ok  {matmul_single_tile.last['latency_us']:9.2f} us")
    a, b = bf16_values((256, 256), 3), bf16_values((256, 2048), 4)
    want = reference(a, b)
    for stage in STAGES:
        got = stage(nki.typed(a, nl.bfloat16), nki.typed(b, nl.bfloat16))
        assert np.array_equal(got, want), stage.fn.__name__
        print(f"{stage.fn.__name__:20s} ok  {stage.last['latency_us']:9.2f} us")


def benchmark(m, k, n):
    """Each stage on lhsT [k, m] x rhs [k, n] bf16, timing only, on one trn3 core."""
    import time
    from tern import _core
    peak = _core.load_chip("trn3").tensor_peak_per_core("bf16")
    flops = 2.0 * m * n * k
    print(f"[{m},{k}] x [{k},{n}] bf16 on one trn3 NeuronCore, timing only "
          f"(peak-FLOPS bound {flops / peak * 1e6:.1f} us)")
    print(f"{'stage':20s} {'latency (us)':>13s} {'% of peak':>10s} {'instructions':>13s} {'host s':>8s}")
    for stage in STAGES:
        t0 = time.perf_counter()
        s = nki.benchmark(stage, platform_target="trn3")(nki.spec((k, m), nl.bfloat16),
                                                          nki.spec((k, n), nl.bfloat16))
        host = time.perf_counter() - t0
        print(f"{stage.fn.__name__:20s} {s['latency_us']:13.1f} {100 * flops / (s['latency_ns'] * 1e-9) / peak:10.1f} "
              f"{s['instructions']:13d} {host:8.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", action="store_true", help="time the stages on a large shape")
    parser.add_argument("--shape", type=int, nargs=3, default=[4096, 8192, 8192], metavar=("M", "K", "N"))
    args = parser.parse_args()
    if args.benchmark:
        benchmark(*args.shape)
    else:
        check()


if __name__ == "__main__":
    main()
