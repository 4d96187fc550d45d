"""Which instructions a kernel's calls become: a per-partition column
operand is the instruction's own operand (tensor_scalar's col0 / col1,
activation's per-partition scale), as on the hardware, not an extra
Vector instruction; the bits are those of the long way round."""
import numpy as np
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl

P, F = 128, 512


def _data(seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal((P, F)).astype(np.float32), g.uniform(0.5, 2, (P, 1)).astype(np.float32)


def _run(kernel, *args):
    out = kernel(*args)
    return out, kernel.last["instructions"]


@nki.jit(platform_target="trn1")
def ts_columns(x, c):
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    col = nl.ndarray((P, 1), dtype=c.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=col, src=c)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.subtract, operand0=col, op1=nl.multiply, operand1=col)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit(platform_target="trn1")
def act_scale_column(x, c):
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    col = nl.ndarray((P, 1), dtype=c.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=col, src=c)
    nisa.activation(dst=t, op=nl.exp, data=t, scale=col)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit(platform_target="trn1")
def act_after_multiply(x, c):
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    col = nl.ndarray((P, 1), dtype=c.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=col, src=c)
    nisa.tensor_tensor(dst=t, data1=t, data2=col.broadcast_to((P, F)), op=nl.multiply)
    nisa.activation(dst=t, op=nl.exp, data=t)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit(platform_target="trn1")
def tile_minus_column(x, c):
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    col = nl.load(c)
    nl.store(out, t - col)
    return out


def test_tensor_scalar_with_two_columns_is_one_instruction_in_fp32():
    x, c = _data()
    out, n = _run(ts_columns, x, c)
    assert n == 4  # three DMAs and one tensor_scalar
    # FP32 between the stages: (x - c) then * c, each rounded to FP32.
    np.testing.assert_array_equal(out, (x - c) * c)


def test_activation_takes_a_per_partition_scale():
    x, c = _data(1)
    out, n = _run(act_scale_column, x, c)
    assert n == 4
    ref, n_ref = _run(act_after_multiply, x, c)
    assert n_ref == 5
    np.testing.assert_array_equal(out, ref)  # exp(fl(x * c)) either way
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64) * c), rtol=2e-6)


def test_tile_op_column_is_a_tensor_scalar():
    x, c = _data(2)
    out, n = _run(tile_minus_column, x, c)
    assert n == 4
    np.testing.assert_array_equal(out, x - c)
    assert tile_minus_column.last["engine_busy_percent"][0]["vector"] > 0
