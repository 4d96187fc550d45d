"""Tensor-parallel matmul across ranks with nki.collectives: each rank is one
simulated chip of a Trn3 UltraServer, and the collectives move real values
over its fabric model.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/collective_matmul.py [--ranks 4]

- row_parallel: rank r holds rows [r K/p, (r+1) K/p) of lhsT and rhs (a
  slice of the contraction), computes its partial product and all-reduces
  it: every rank ends with lhsT.T @ rhs (the partials added in FP32 in rank
  order, rounded once).
- gathered: rank r computes the M/p result rows of its lhsT columns and
  all-gathers them: every rank ends with the whole result.
"""
import argparse

import numpy as np

import tern.nki as nki
import tern.nki.collectives as ncc
import tern.nki.isa as nisa
import tern.nki.language as nl


def _matmul_into(out, lhsT, rhs):
    """out[M, N] = lhsT[K, M].T @ rhs[K, N] (K a multiple of 128, M <= 128, N <= 512)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.load(lhsT[k * 128:(k + 1) * 128, 0:M])
        b = nl.load(rhs[k * 128:(k + 1) * 128, 0:N])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    nl.store(out, value=nl.copy(acc))


@nki.jit
def row_parallel(lhsT, rhs, ranks):
    """This rank's K-slice: a partial [M, N] product, then all-reduced."""
    _, M = lhsT.shape
    _, N = rhs.shape
    partial = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.private_hbm)
    _matmul_into(partial, lhsT, rhs)
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    everyone = ncc.ReplicaGroup([list(range(ranks))])
    ncc.all_reduce(srcs=[partial], dsts=[result], replica_group=everyone, op=nl.add)
    return result


@nki.jit
def gathered(lhsT, rhs, ranks):
    """This rank's M/p rows of the result, then all-gathered along rows."""
    _, M = lhsT.shape
    _, N = rhs.shape
    mine = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.private_hbm)
    _matmul_into(mine, lhsT, rhs)
    p = ranks
    result = nl.ndarray((p * M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[mine], dsts=[result], replica_group=ncc.ReplicaGroup([list(range(p))]),
                   collective_dim=0)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4, help="ranks (chips), default 4")
    a = ap.parse_args()
    p = a.ranks
    rng = np.random.default_rng(0)
    K, M, N = 128 * p, 128, 512
    lhsT = rng.standard_normal((K, M), dtype=np.float32)
    rhs = rng.standard_normal((K, N), dtype=np.float32)
    want = lhsT.T.astype(np.float64) @ rhs

    k = nki.simulate(row_parallel, ranks=p)
    slices = nki.per_rank([lhsT[r * 128:(r + 1) * 128] for r in range(p)])
    results = k(slices, nki.per_rank([rhs[r * 128:(r + 1) * 128] for r in range(p)]), p)
    err = max(float(np.abs(r - want).max()) for r in results)
    print(f"row_parallel on {p} ranks of {k.last['system']}: max |error| {err:.2e} vs float64")
    for e in k.last["collectives"]:
        print(f"  {e['op']} ({e['algorithm']}) of {e['bytes']} B over chips {e['chips']}: "
              f"starts {e['start_ns'] / 1e3:.2f} us, takes {e['duration_ns'] / 1e3:.2f} us")
    print(f"  kernel time {k.last['latency_us']:.2f} us")

    g = nki.simulate(gathered, ranks=p)
    cols = nki.per_rank([lhsT[:128, r * (M // p):(r + 1) * (M // p)] for r in range(p)])
    results = g(cols, rhs[:128], p)
    want_g = lhsT[:128].T.astype(np.float64) @ rhs[:128]
    err = max(float(np.abs(r - want_g).max()) for r in results)
    print(f"gathered on {p} ranks: max |error| {err:.2e}; kernel time {g.last['latency_us']:.2f} us")


if __name__ == "__main__":
    main()
