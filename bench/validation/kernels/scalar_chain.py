"""A chain of dependent Scalar-engine tensor_scalar instructions, one fp32
element per partition: each reads what the previous one wrote, so the
interval between their starts is the engine's dependent-instruction
initiation interval (the case the NKI performance guide measures for
ScalarE on NeuronCore-v3)."""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def scalar_chain(x, steps):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    for _ in range(steps):
        nisa.tensor_scalar(dst=b, data=a, op0=nl.multiply, operand0=1.0, op1=nl.add,
                           operand1=0.0, engine=nisa.scalar_engine)
        a, b = b, a
    nisa.dma_copy(dst=out, src=a)
    return out
