"""A traced-and-simulated NKI kernel: binding the caller's arguments to HBM
tensors, tracing the kernel once per rank, running it and handing back the
results in the kernel's dtypes."""
import inspect
import math

import numpy as np

from tern import _core
from tern.nki import _io
from tern.nki import _registers
from tern.nki import _tracer
from tern.nki import language as nl


class typed(np.ndarray):
    """An input array with an NKI dtype numpy lacks: `nki.typed(x, nl.bfloat16)`
    passes x's values (rounded to nearest even) as a bfloat16 HBM tensor."""

    def __new__(cls, values, dtype):
        obj = np.asarray(values, dtype=np.float32).view(cls)
        obj.nki_dtype = dtype
        return obj

    def __array_finalize__(self, obj):
        self.nki_dtype = getattr(obj, "nki_dtype", None)


class spec:
    """A shape and dtype standing for an input in timing-only runs (no data):
    `nki.benchmark(kernel)(nki.spec((4096, 8192), nl.bfloat16), ...)`."""

    def __init__(self, shape, dtype):
        self.shape, self.nki_dtype, self.ndim = tuple(int(s) for s in shape), dtype, len(shape)
        self.dtype = None


class per_rank(list):
    """Inputs that differ by rank: `nki.per_rank([a0, a1, ...])` gives rank r
    the array a[r] (other inputs are the same on every rank)."""


def grid_extents(grid):
    """kernel[2], kernel[2, 2], kernel[nl.nc(2)], kernel[nl.spmd_dim(...)] -> extents."""
    if isinstance(grid, tuple):
        out = []
        for g in grid:
            out += list(grid_extents(g))
        return tuple(out)
    if hasattr(grid, "extents"):
        return tuple(grid.extents)
    n = int(grid)
    if n < 1:
        raise ValueError(f"a launch grid extent must be >= 1, got {n}")
    return (n,)


class Input:
    """One HBM tensor made from a caller's array: its name, the array, the
    NKI dtype and the bytes written before the run."""

    def __init__(self, name, array, dtype, raw):
        self.name, self.array, self.dtype, self.raw = name, array, dtype, raw


def _flatten(result):
    if result is None:
        return []
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _flatten(r)]
    return [result]


def _rebuild(result, values):
    """The kernel's return structure with its tensors replaced by arrays."""
    if result is None:
        return None
    if isinstance(result, (tuple, list)):
        return type(result)(_rebuild(r, values) for r in result) if isinstance(result, tuple) else \
            [_rebuild(r, values) for r in result]
    return values[id(result)]


class Kernel:
    """A traced-and-simulated NKI kernel: call it like a function."""

    def __init__(self, fn, platform_target=None, grid=(), mode="both", trace=None, dtypes=None,
                 ranks=None, system=None, strict_reads=False):
        self.fn, self.platform_target, self.grid = fn, platform_target, tuple(grid)
        self.mode, self.trace_path, self.dtypes = mode, trace, dtypes or {}
        self.ranks, self.system = ranks, system  # ranks None: one rank, results not listed
        # strict_reads: reading SBUF/PSUM no instruction wrote is an error
        # (default: it reads what the memory holds, as the hardware).
        self.strict_reads = strict_reads
        self.last = None  # summary of the last run
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __getitem__(self, grid):
        """kernel[2](...), kernel[2, 2](...): a launch grid of programs."""
        return Kernel(self.fn, self.platform_target, grid_extents(grid), self.mode, self.trace_path,
                      self.dtypes, self.ranks, self.system, self.strict_reads)

    def __get__(self, obj, objtype=None):  # a kernel defined as a method
        if obj is None:
            return self
        import functools
        return functools.partial(self.__call__, obj)

    # ------------------------------------------------------------ tracing
    def _tensor(self, tr, name, a, rank, ranks, inputs):
        """The HBM tensor standing for argument `a` (arrays and specs), or a."""
        if isinstance(a, per_rank):
            if len(a) != ranks:
                raise ValueError(f"argument {name}: nki.per_rank of {len(a)} arrays for {ranks} ranks")
            a = a[rank]
        if isinstance(a, (list, tuple)) and a and all(_io.is_array(x) or isinstance(x, spec) for x in a):
            return type(a)(self._tensor(tr, f"{name}_{i}", x, rank, ranks, inputs) for i, x in enumerate(a))
        if isinstance(a, spec) and self.mode != "timing":
            raise ValueError("nki.spec inputs carry no data: use them with nki.benchmark (timing only)")
        if not (isinstance(a, spec) or _io.is_array(a)):
            return a
        dt = self.dtypes.get(name) or (a.nki_dtype if isinstance(a, spec) else _io.natural_dtype(a))
        shape = tuple(int(s) for s in a.shape) or (1,)
        if any(s < 1 for s in shape):
            raise ValueError(f"argument {name}: an empty array of shape {tuple(a.shape)} (NKI tensors "
                             "have every dim >= 1)")
        base = tr.declare_hbm(name, shape, dt, False)
        if not isinstance(a, spec):
            inputs.append(Input(name, a, dt, None if self.mode == "timing" else _io.encode(a, dt)))
        return nl.hbm_tensor(base, nl.hbm, dt, shape, name)

    def _bind(self, args, kwargs):
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel {self.__name__}: {e}") from None
        return bound

    def _trace(self, chip, rank, ranks, args, kwargs):
        """Traces the kernel for one rank: (trace, result, [Input]); a
        register_load is resolved by simulating the kernel up to it, then
        tracing again with its value known (_registers.py)."""
        known, lifetimes = [], None
        while True:
            try:
                return self._trace_once(chip, rank, ranks, args, kwargs, known, lifetimes)
            except _registers.NeedValue as need:
                known.append(self._register_value(chip, need))
            except _core.TernError as e:
                # SBUF / PSUM full while the kernel still holds tiles it will
                # not use again: the NKI compiler allocates by liveness, so
                # tern measures every tile's last use in a trace that may
                # overcommit, then traces again freeing tiles after it.
                if lifetimes is not None or "does not fit" not in str(e):
                    raise
                lifetimes = self._lifetimes(chip, rank, ranks, args, kwargs, known)
                if lifetimes is None:
                    raise

    def _lifetimes(self, chip, rank, ranks, args, kwargs, known):
        try:
            return self._trace_once(chip, rank, ranks, args, kwargs, known, None, overcommit=True)
        except (_registers.NeedValue, _core.TernError):
            return None

    def _register_value(self, chip, need):
        if self.mode == "timing":
            raise NotImplementedError("not supported: a register loaded from kernel data in a timing-only run "
                                      "(its value, and so the instructions that follow, depend on the data)")
        tr = need.trace
        if tr.collectives:
            raise NotImplementedError("not supported: a register_load after a collective")
        try:
            sim = _core.Simulator(chip)
            sim.load(tr.finish()[0])
            write_inputs(sim, need.inputs)
            sim.run("functional", False, 0, not self.strict_reads)
        except _core.TernError as e:
            raise NotImplementedError(f"not supported: a register_load tern cannot resolve by simulating the "
                                      f"kernel up to it: {e}") from None
        value = _io.decode(sim.read_bytes(need.name), need.dtype, (1,), False)
        return int(_io.to_float32(value)[0]) if isinstance(value, _io.Bits) else int(value[0])

    def _trace_once(self, chip, rank, ranks, args, kwargs, known, lifetimes, overcommit=False):
        tr = _tracer.Trace(chip, self.grid, rank, ranks)
        tr.register_values, tr.lifetimes = known, lifetimes
        if overcommit:
            tr.set_overcommit()
        inputs = []
        with tr:
            bound = self._bind(args, kwargs)
            params = inspect.signature(self.fn).parameters
            for name, value in list(bound.arguments.items()):
                kind = params[name].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    value = tuple(self._tensor(tr, f"{name}{i}", v, rank, ranks, inputs)
                                  for i, v in enumerate(value))
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    value = {k: self._tensor(tr, k, v, rank, ranks, inputs) for k, v in value.items()}
                else:
                    value = self._tensor(tr, name, value, rank, ranks, inputs)
                bound.arguments[name] = value
            result = None
            try:
                for pid in range(max(tr.programs, 1)):
                    tr.program_id = pid
                    tr.hbm_counter = 0
                    tr.builder.set_core(pid % tr.cores)
                    result = self.fn(*bound.args, **bound.kwargs)
                    tr.flush()
            except _registers.NeedValue as need:
                need.trace, need.inputs = tr, inputs + self._constants(tr)
                raise
            if overcommit:
                return tr.recorded
            tr.finish()
        inputs += self._constants(tr)
        names = {i.name for i in inputs}
        for o in _flatten(result):
            if not isinstance(o, nl.NkiTensor) or o.buffer not in (nl.shared_hbm, nl.hbm, nl.private_hbm):
                raise TypeError(f"kernel {self.__name__} returns {o!r}: a kernel returns HBM tensors "
                                "(nl.ndarray(..., buffer=nl.shared_hbm), or one of its inputs)")
        return tr, result, inputs

    def _constants(self, tr):
        return [Input(name, None, dt, None if self.mode == "timing" else _io.encode(arr, dt))
                for name, arr, dt in tr.constants]

    def __call__(self, *args, **kwargs):
        if _tracer._current is not None:  # a kernel called from a kernel: inlined
            return self.fn(*args, **kwargs)
        chip = _core.load_chip(_tracer.target_name(self.platform_target))
        ranks = self.ranks or 1
        traced = [self._trace(chip, r, ranks, args, kwargs) for r in range(ranks)]
        if self.ranks is None and not traced[0][0].collectives:
            return self._run_one(chip, *traced[0])
        from tern.nki import _ranks
        return _ranks.run(self, chip, traced)

    # ------------------------------------------------------------ running
    def _run_one(self, chip, tr, result, inputs):
        """One program on one chip: the instruction-level profile and trace."""
        program = tr.segments[0]
        sim = _core.Simulator(chip)
        sim.load(program)
        if self.mode != "timing":
            write_inputs(sim, inputs)
        summary, stats = sim.run(self.mode, bool(self.trace_path), 0, not self.strict_reads)
        if self.trace_path:
            _core.write_trace(stats, chip, self.trace_path)
        summary["program_instructions"] = program.instruction_count()
        self.last = summary
        if self.mode == "timing":
            return summary
        return results(sim, tr, result, inputs)


def write_inputs(sim, inputs):
    for i in inputs:
        sim.write_bytes(i.name, i.raw)


def _output_array(sim, tr, o, as_torch):
    shape, dtype = tr.hbm_shape(o.name)
    nbytes = math.prod(shape) * _core.dtype_size(dtype)
    whole = o._p0 == 0 and o._off == 0 and math.prod(o.shape) * _core.dtype_size(o.dtype) == nbytes
    if not whole:
        raise NotImplementedError(f"not supported: returning a part of HBM tensor {o.name} "
                                  f"(shape {o.shape} of {shape}); return the whole tensor")
    # A whole-tensor view (a reshape, or .view(dtype)) comes back as the view.
    return _io.decode(sim.read_bytes(o.name), o.dtype, o.shape, as_torch)


def results(sim, tr, result, inputs):
    """The kernel's results (its return structure, arrays in its dtypes);
    inputs the kernel wrote are updated in the caller's arrays too."""
    for prefix, name, shape in tr.prints:
        print(prefix, sim.read(name).reshape(shape))
    as_torch = any(_io.is_torch(i.array) for i in inputs)
    for i in inputs:
        if i.array is None:
            continue
        after = sim.read_bytes(i.name)
        if not np.array_equal(after, i.raw):
            _io.write_back(i.array, after, i.dtype)
    values = {id(o): _output_array(sim, tr, o, as_torch) for o in _flatten(result)}
    return _rebuild(result, values)
