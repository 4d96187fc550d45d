"""Two programs of a logical NeuronCore (LNC=2) working together: each
normalizes its half of the rows by the maximum of the whole tensor, which
the programs agree on by swapping their partial maxima with
nisa.sendrecv; nisa.core_barrier then orders their writes of a shared
scratch tensor before the other program reads it.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/lnc2_exchange.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def scale_by_global_max(x):
    """out = x / max(x) for x [256, F], the rows split over kernel[2]'s programs;
    also returns each program's partial maxima as seen by the other one."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    seen = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    pid, n = nl.program_id(0), nl.num_programs(0)
    half = rows // n
    mine = x[pid * half:(pid + 1) * half, :]
    t = nl.ndarray((half, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=mine)
    part = nl.ndarray((half, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=part, op=nl.maximum, data=t, axis=1)
    other = nl.ndarray((half, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=part, dst=other, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nisa.dma_copy(dst=seen[pid * half:(pid + 1) * half, :], src=other)
    both = nl.ndarray((half, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=both, data1=part, data2=other, op=nl.maximum)
    # The maximum over partitions: transpose the column, reduce, broadcast back.
    row = nl.ndarray((1, half), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=row, data=both)
    top = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=top, op=nl.maximum, data=row, axis=1)
    scratch = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=scratch[pid:pid + 1, :], src=top)
    nisa.core_barrier(scratch, (0, 1))
    g = nl.ndarray((half, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=scratch[1 - pid:2 - pid, :].ap([[0, half], [1, 1]]))
    nisa.reciprocal(dst=g, data=g)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=g)
    nisa.dma_copy(dst=out[pid * half:(pid + 1) * half, :], src=t)
    return out, seen


def main():
    x = np.random.default_rng(1).uniform(0.5, 4.0, (256, 64)).astype(np.float32)
    for target in ("trn2", "trn3"):
        k = nki.jit(scale_by_global_max.fn, platform_target=target)[2]
        out, seen = k(x)
        halves = x.reshape(2, 128, 64).max(axis=2)
        assert np.array_equal(seen[:, 0], np.concatenate([halves[1], halves[0]]))
        assert np.allclose(out, x / x.max(), rtol=1e-6)
        print(f"{target}: LNC=2 exchange ok, {k.last['latency_us']:.2f} us simulated on {k.last['cores']} cores")


if __name__ == "__main__":
    main()
