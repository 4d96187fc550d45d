"""Tensor add in the public NKI style, run on tern's simulated chip.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/tensor_add.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def nki_tensor_add_kernel(a_input, b_input):
    """c = a + b for [R, C] tensors, R a multiple of 128, C a multiple of 512;
    with a launch grid of 2 each program adds half of the rows."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    tile_p, tile_f = nl.tile_size.pmax, 512
    share = rows // nl.num_programs()
    first = nl.program_id() * share
    for r in nl.affine_range(share // tile_p):
        for c in nl.affine_range(cols // tile_f):
            p0, f0 = first + r * tile_p, c * tile_f
            a = nl.ndarray((tile_p, tile_f), dtype=a_input.dtype, buffer=nl.sbuf)
            b = nl.ndarray((tile_p, tile_f), dtype=a_input.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=a_input[p0:p0 + tile_p, f0:f0 + tile_f])
            nisa.dma_copy(dst=b, src=b_input[nl.ds(p0, tile_p), nl.ds(f0, tile_f)])
            c_tile = nl.ndarray((tile_p, tile_f), dtype=a_input.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=c_tile, data1=a, data2=b, op=nl.add)
            nisa.dma_copy(dst=c_output[p0:p0 + tile_p, f0:f0 + tile_f], src=c_tile)
    return c_output


def main():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)
    c = nki_tensor_add_kernel(a, b)
    assert np.array_equal(c, a + b)
    print(f"tensor add: ok, {nki_tensor_add_kernel.last['latency_us']:.2f} us simulated")
    on_two = nki_tensor_add_kernel[2]
    c2 = on_two(a, b)
    assert np.array_equal(c2, a + b)
    print(f"tensor add, grid of 2: ok, {on_two.last['latency_us']:.2f} us simulated")


if __name__ == "__main__":
    main()
