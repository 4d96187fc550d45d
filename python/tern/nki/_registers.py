"""Sequencer registers (nisa.register_alloc / move / load / store) and the
control flow that reads them (nl.dynamic_range with a register bound,
nl.fori_loop, nl.while_loop, `while reg:`, .ap(scalar_offset=reg)).

tern knows every register's value while it traces. A register_load whose
value is not known yet stops the trace: the kernel's instructions so far are
simulated with its inputs (functional model), the value is read back, and
the trace starts again with it known. Loops over registers are therefore
unrolled into the instructions the hardware runs, iteration by iteration;
the sequencer's own register and branch instructions are not timed
(docs/nki.md)."""
import builtins

from tern.nki import _tracer

# A kernel whose register loads never settle (a while loop that does not
# end) stops with an error after this many loads.
MAX_LOADS = 4096


class VirtualRegister:
    """A 32-bit register of an engine sequencer; its value is known while
    tracing (an int in loops, offsets and comparisons)."""

    def __init__(self, value=None):
        self._value = None if value is None else int(value)

    @property
    def value(self):
        return 0 if self._value is None else self._value

    def __index__(self):
        return self.value

    __int__ = __index__

    def __bool__(self):
        return self.value != 0

    def __eq__(self, other):
        return self.value == int(other)

    def __ne__(self, other):
        return self.value != int(other)

    def __lt__(self, other):
        return self.value < int(other)

    def __le__(self, other):
        return self.value <= int(other)

    def __gt__(self, other):
        return self.value > int(other)

    def __ge__(self, other):
        return self.value >= int(other)

    __hash__ = object.__hash__

    # Arithmetic gives a new register (NkiScalar arithmetic), with the value
    # Python computes.
    def _new(self, value):
        return VirtualRegister(value)

    def __add__(self, other):
        return self._new(self.value + int(other))

    __radd__ = __add__

    def __sub__(self, other):
        return self._new(self.value - int(other))

    def __rsub__(self, other):
        return self._new(int(other) - self.value)

    def __mul__(self, other):
        return self._new(self.value * int(other))

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return self._new(self.value // int(other))

    def __mod__(self, other):
        return self._new(self.value % int(other))

    def __neg__(self):
        return self._new(-self.value)

    def __and__(self, other):
        return self._new(self.value & int(other))

    def __or__(self, other):
        return self._new(self.value | int(other))

    def __lshift__(self, other):
        return self._new(self.value << int(other))

    def __rshift__(self, other):
        return self._new(self.value >> int(other))

    def __repr__(self):
        return f"VirtualRegister({self.value})"


class NeedValue(Exception):
    """Raised by register_load when its value is not known yet: the kernel
    (trace, inputs) is simulated up to the copy into HBM tensor `name`."""

    def __init__(self, name, dtype):
        super().__init__(f"register value {name} is not known yet")
        self.name, self.dtype = name, dtype
        self.trace = self.inputs = None


def alloc(x=None):
    return VirtualRegister(x.value if isinstance(x, VirtualRegister) else x)


def move(dst, src):
    dst._value = int(src)
    return dst


def load(dst, src):
    """dst <- the scalar in src (its first element; a float is truncated)."""
    tr = _tracer.current()
    k = tr.register_loads
    tr.register_loads += 1
    if k < len(tr.register_values):
        dst._value = tr.register_values[k]
        return dst
    if k >= MAX_LOADS:
        raise RuntimeError(f"more than {MAX_LOADS} register loads: a register loop that does not end? "
                           f"({_tracer.kernel_location()})")
    from tern.nki import isa
    from tern.nki import language as nl
    first = src if src.size == 1 else isa._flat2(src)[0:1, 0:1]
    if first.buffer is nl.psum:  # DMA cannot read PSUM: stage through SBUF
        first = nl.copy(first)
    name = f"__register{k}"
    shape = (1,) * max(first.ndim, 1)
    base = tr.declare_hbm(name, shape, first.dtype, True)
    isa.dma_copy(dst=nl.hbm_tensor(base, nl.shared_hbm, first.dtype, shape, name), src=first)
    raise NeedValue(name, first.dtype)


def store(dst, src):
    """dst (a tile or HBM tensor) <- the register's value in every element."""
    from tern.nki import isa
    from tern.nki import language as nl
    if dst.is_hbm:
        t = nl.ndarray(dst.shape, dst.dtype, buffer=nl.sbuf)
        isa.memset(dst=t, value=int(src))
        isa.dma_copy(dst=dst, src=t)
    else:
        isa.memset(dst=dst, value=int(src))


def fori_loop(lower, upper, body_fun, step=1):
    """body_fun(i) for i in range(lower, upper, step); i is a register when a
    bound is one."""
    if isinstance(step, VirtualRegister) or int(step) <= 0:
        raise ValueError(f"fori_loop step must be a positive int, got {step!r} ({_tracer.kernel_location()})")
    as_reg = isinstance(lower, VirtualRegister) or isinstance(upper, VirtualRegister)
    for i in builtins.range(int(lower), int(upper), int(step)):
        body_fun(VirtualRegister(i) if as_reg else i)


def while_loop(init, body_fun):
    """r = init; while r != 0: r = body_fun(r) (a copy of r each time)."""
    r = init
    while int(r) != 0:
        r = body_fun(VirtualRegister(int(r)))
        if r is None:
            raise TypeError(f"while_loop body returned None: it returns the next condition register "
                            f"({_tracer.kernel_location()})")
