"""The first three stages of the NKI matrix-multiplication tutorial, in the
current NKI generation (dst= everywhere), written for this project from the
tutorial's description: result[M, N] = lhsT[K, M].T @ rhs[K, N], bf16 in,
FP32 accumulation in PSUM, bf16 out; tiles of 128 (K) x 128 (M) stationary
and 128 x 512 (N) moving.

- matmul_tiled: every (m, n, k) loads its lhsT and rhs tiles.
- matmul_hoist_load: per row block m, all K lhsT tiles are loaded once; per
  column block n, all K rhs tiles are loaded, then the K matmuls run.
- matmul_block_free: as hoist_load over blocks of 2 x 2 output tiles, so
  each loaded tile serves two matmuls.
"""
import nki
import nki.isa as nisa
import nki.language as nl

BLOCK_M, BLOCK_N = 2, 2  # output tiles per block in matmul_block_free


def _setup(lhsT, rhs):
    """K, M, N, the tile sizes (K, M, N) and the bf16 result in HBM."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    tiles = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    return (K, M, N) + tiles + (result,)


def _evacuate(result, acc, m0, n0):
    """PSUM -> SBUF (cast to the result's dtype) -> HBM."""
    tm, tn = acc.shape
    out = nl.ndarray((tm, tn), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    nisa.dma_copy(dst=result[m0:m0 + tm, n0:n0 + tn], src=out)


def _load(src, rows, cols, r0, c0):
    t = nl.ndarray((rows, cols), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src[r0:r0 + rows, c0:c0 + cols])
    return t


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M, N, tk, tm, tn, result = _setup(lhsT, rhs)
    for m in nl.affine_range(M // tm):
        for n in nl.affine_range(N // tn):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // tk):
                a = _load(lhsT, tk, tm, k * tk, m * tm)
                b = _load(rhs, tk, tn, k * tk, n * tn)
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            _evacuate(result, acc, m * tm, n * tn)
    return result


@nki.jit
def matmul_hoist_load(lhsT, rhs):
    K, M, N, tk, tm, tn, result = _setup(lhsT, rhs)
    for m in nl.affine_range(M // tm):
        a = [_load(lhsT, tk, tm, k * tk, m * tm) for k in nl.affine_range(K // tk)]
        for n in nl.affine_range(N // tn):
            b = [_load(rhs, tk, tn, k * tk, n * tn) for k in nl.affine_range(K // tk)]
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // tk):
                nisa.nc_matmul(dst=acc, stationary=a[k], moving=b[k])
            _evacuate(result, acc, m * tm, n * tn)
    return result


@nki.jit
def matmul_block_free(lhsT, rhs):
    K, M, N, tk, tm, tn, result = _setup(lhsT, rhs)
    for mb in nl.affine_range(M // (tm * BLOCK_M)):
        a = [[_load(lhsT, tk, tm, k * tk, (mb * BLOCK_M + i) * tm) for k in nl.affine_range(K // tk)]
             for i in nl.affine_range(BLOCK_M)]
        for nb in nl.affine_range(N // (tn * BLOCK_N)):
            b = [[_load(rhs, tk, tn, k * tk, (nb * BLOCK_N + j) * tn) for k in nl.affine_range(K // tk)]
                 for j in nl.affine_range(BLOCK_N)]
            for i in nl.affine_range(BLOCK_M):
                for j in nl.affine_range(BLOCK_N):
                    acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // tk):
                        nisa.nc_matmul(dst=acc, stationary=a[i][k], moving=b[j][k])
                    _evacuate(result, acc, (mb * BLOCK_M + i) * tm, (nb * BLOCK_N + j) * tn)
    return result
