"""nki.isa random numbers: rng, rand2, rand_set_state / rand_get_state,
set_rng_seed, and dropout at any rate. The engines keep per-partition
XORWOW states (the algorithm NKI's ISA reference names); how a seed becomes
a state and how outputs become floats are not published, so tern's streams
are reproducible but not the hardware's bits (docs/nki.md)."""
from tern import _core
from tern.nki import _tracer

_RANDOM = ("partial: XORWOW per partition as the ISA reference names it; seeding and float conversion are "
           "tern's (reproducible, not the hardware's bits)")


def _isa():
    from tern.nki import isa
    return isa


def _random_engine(engine, default):
    isa = _isa()
    return isa._engine(engine, default)


def _state_op(tile, mode, engine):
    isa = _isa()
    isa._emit("rng_state", engine, [isa._flat2(tile)], imm2=float(mode))


@_tracer.status(_RANDOM)
def rng(dst, engine=None, name=None):
    """dst <- the low bits of 32-bit random numbers, one per element (integer
    dst; Vector engine by default, GpSimd from NeuronCore-v3)."""
    isa = _isa()
    isa._emit("rng", _random_engine(engine, _core.Engine.vector), [isa._flat2(dst)], imm2=0.0)


def uniform(dst, lo, hi, engine=_core.Engine.vector):
    """dst <- uniform FP32 values in [lo, hi) (scalars or [P, 1] columns)."""
    isa = _isa()
    ops = [isa._flat2(dst)]
    c0, c1 = isa._is_tile(lo), isa._is_tile(hi)
    ops += [isa._as_col(lo)] if c0 else []
    ops += [isa._as_col(hi)] if c1 else []
    isa._emit("rng", engine, ops, imm0=0.0 if c0 else float(lo), imm1=0.0 if c1 else float(hi), imm2=1.0,
              col0=c0, col1=c1)


@_tracer.status(_RANDOM)
def rand2(dst, min, max, name=None):  # noqa: A002 (NKI's argument names)
    """dst <- uniform random values in [min, max) on NeuronCore-v4's Vector
    engine (min / max scalars or [P, 1] columns)."""
    if _tracer.current().chip.core_version < 4:
        raise ValueError(f"rand2 needs NeuronCore-v4 (trn3) ({_tracer.kernel_location()})")
    if not (_isa()._is_tile(min) or _isa()._is_tile(max)) and not float(min) < float(max):
        raise ValueError(f"rand2 needs min < max, got {min} and {max} ({_tracer.kernel_location()})")
    uniform(dst, min, max)


@_tracer.status(_RANDOM)
def rand_set_state(src_seeds, engine=None, name=None):
    """Each lane's generator state from partition p of src_seeds ([P, 6]
    uint32 on GpSimd, [P, 24] on NeuronCore-v4's Vector engine)."""
    _state_op(src_seeds, 0, _random_engine(engine, _core.Engine.gpsimd))


@_tracer.status(_RANDOM)
def rand_get_state(dst, engine=None, name=None):
    """dst <- each lane's generator state (the layout of rand_set_state)."""
    _state_op(dst, 1, _random_engine(engine, _core.Engine.gpsimd))


@_tracer.status(_RANDOM)
def set_rng_seed(src_seeds, name=None):
    """Seeds the Vector engine's generator of every lane from the 32-bit
    value of the [1, 1] tile src_seeds."""
    _state_op(src_seeds, 2, _core.Engine.vector)


@_tracer.status(_RANDOM + "; the mask keeps an element when its uniform draw is >= prob (no rescaling, as "
                "the ISA reference says)")
def dropout(dst, data, prob, name=None):
    """dst = data with each element zeroed with probability prob (a scalar
    or a [P, 1] column), on the Vector engine."""
    isa = _isa()
    p = None if isa._is_tile(prob) else float(prob)
    if p == 0.0:
        isa.tensor_copy(dst=dst, src=data)
        return
    if p == 1.0:
        isa.memset(dst=dst, value=0.0)
        return
    u = isa._scratch(data.shape)
    uniform(u, 0.0, 1.0)
    keep = isa._scratch(data.shape)
    from tern.nki import language as nl
    isa.tensor_scalar(dst=keep, data=u, op0=nl.greater_equal, operand0=prob)
    isa.memset(dst=dst, value=0.0)
    isa.tensor_copy_predicated(dst=dst, src=data, predicate=keep)
