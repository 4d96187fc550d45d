"""2-D transpose through the Tensor engine, in the public NKI style.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/transpose2d.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def transpose2d_kernel(in_tensor):
    """out[C, R] = in[R, C]^T in 128 x 128 blocks (R, C multiples of 128)."""
    rows, cols = in_tensor.shape
    out = nl.ndarray((cols, rows), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    t = nl.tile_size.pmax
    for i in nl.affine_range(rows // t):
        for j in nl.affine_range(cols // t):
            tile = nl.load(in_tensor[i * t:(i + 1) * t, j * t:(j + 1) * t])
            flipped = nl.ndarray((t, t), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=flipped, data=tile)
            res = nl.copy(flipped, dtype=in_tensor.dtype)
            nl.store(out[j * t:(j + 1) * t, i * t:(i + 1) * t], value=res)
    return out


def main():
    x = np.random.default_rng(1).standard_normal((256, 384), dtype=np.float32)
    y = transpose2d_kernel(x)
    assert np.array_equal(y, x.T)
    print(f"transpose2d: ok, {transpose2d_kernel.last['latency_us']:.2f} us simulated")


if __name__ == "__main__":
    main()
