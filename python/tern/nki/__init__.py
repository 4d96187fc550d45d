"""tern.nki: run NKI kernels written in Python on tern's simulated chip.

    import tern.nki as nki
    import tern.nki.language as nl
    import tern.nki.isa as nisa

    @nki.jit
    def kernel(a, b): ...          # the public NKI API
    out = kernel(a_np, b_np)        # traced, simulated, numpy results

Unmodified kernel files that `import nki` run after `tern.nki.install()`
(or `import tern.nki.as_nki`), which makes `nki`, `nki.language` and
`nki.isa` resolve to tern's. The target follows
NEURON_PLATFORM_TARGET_OVERRIDE (trn1, trn2, trn3; default trn3) or
`platform_target=`.
"""
import inspect
import sys

import numpy as np

from tern import _core
from tern.nki import _tracer
from tern.nki import isa  # noqa: F401
from tern.nki import language  # noqa: F401
from tern.nki import language as nl

TernError = _core.TernError

_NUMPY_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int16): "int16",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.int32): "int32",
    np.dtype(np.uint32): "uint32",
}


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


def _input_dtype(a, override):
    if override is not None:
        return override
    if getattr(a, "nki_dtype", None):
        return a.nki_dtype
    if a.dtype == np.float64:
        return "float32"
    try:
        return _NUMPY_DTYPES[a.dtype]
    except KeyError:
        raise TypeError(f"no tern dtype for numpy {a.dtype}; pass dtypes={{...}}") from None


class Kernel:
    """A traced-and-simulated NKI kernel: call it like a function."""

    def __init__(self, fn, platform_target=None, grid=1, mode="both", trace=None, dtypes=None):
        self.fn, self.platform_target, self.grid = fn, platform_target, grid
        self.mode, self.trace_path, self.dtypes = mode, trace, dtypes or {}
        self.last = None  # summary of the last run

    def __getitem__(self, grid):
        """kernel[2](...): a launch grid of logical cores (program ids 0..n-1)."""
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise NotImplementedError("not supported: launch grids with more than one axis")
            grid = grid[0]
        return Kernel(self.fn, self.platform_target, int(grid), self.mode, self.trace_path, self.dtypes)

    def __call__(self, *args, **kwargs):
        chip = _core.load_chip(_tracer.target_name(self.platform_target))
        names = list(inspect.signature(self.fn).parameters)
        tr = _tracer.Trace(chip, self.grid)
        inputs = []
        with tr:
            tensor_args = []
            for i, a in enumerate(args):
                if isinstance(a, spec) and self.mode != "timing":
                    raise ValueError("nki.spec inputs carry no data: use them with nki.benchmark (timing only)")
                if isinstance(a, (np.ndarray, spec)):
                    name = names[i] if i < len(names) else f"arg{i}"
                    dt = _input_dtype(a, self.dtypes.get(name))
                    shape = a.shape if a.ndim > 0 else (1,)
                    base = tr.at().hbm(name, list(shape), dt, False)
                    tensor_args.append(nl.hbm_tensor(base, nl.hbm, dt, tuple(shape), name))
                    if isinstance(a, np.ndarray):
                        inputs.append((name, a))
                else:
                    tensor_args.append(a)
            result = None
            for pid in range(self.grid):
                tr.program_id = pid
                tr.hbm_counter = 0
                tr.builder.set_core(pid)
                result = self.fn(*tensor_args, **kwargs)
            program = tr.builder.finish()
        outs = result if isinstance(result, (tuple, list)) else (() if result is None else (result,))
        for o in outs:
            if not isinstance(o, nl.NkiTensor) or o.buffer is not nl.shared_hbm:
                raise TypeError("a kernel returns nl.shared_hbm tensors (nl.ndarray(..., buffer=nl.shared_hbm))")
        sim = _core.Simulator(chip)
        sim.load(program)
        if self.mode != "timing":
            for name, a in inputs:
                sim.write(name, np.ascontiguousarray(a, dtype=np.float32).reshape(-1))
        summary, stats = sim.run(self.mode, bool(self.trace_path))
        if self.trace_path:
            _core.write_trace(stats, chip, self.trace_path)
        summary["program_instructions"] = program.instruction_count()
        self.last = summary
        if self.mode == "timing":
            return summary
        for prefix, name, shape in tr.prints:
            print(prefix, sim.read(name).reshape(shape))
        arrays = tuple(sim.read(o.name).reshape(o.shape) for o in outs)
        return arrays[0] if isinstance(result, nl.NkiTensor) else arrays


def jit(fn=None, *, platform_target=None, **_ignored):
    """@nki.jit: trace at call time, simulate, return numpy arrays."""
    if fn is None:
        return lambda f: Kernel(f, platform_target)
    return Kernel(fn, platform_target)


def simulate(kernel, platform_target=None):
    """nki.simulate(kernel)(*args): functional results as numpy arrays."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else 1
    return Kernel(fn, platform_target, grid, "both")


def benchmark(kernel, platform_target=None, timing_only=True, trace=None, dtypes=None):
    """tern.nki.benchmark(kernel)(*args): the simulated latency and profile
    summary (a dict); timing_only skips the data (inputs only give shapes)."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else 1
    k = Kernel(fn, platform_target, grid, "timing" if timing_only else "both", trace, dtypes)

    def run(*args, **kwargs):
        out = k(*args, **kwargs)
        return k.last if not timing_only else out

    return run


def install():
    """Make `import nki` (and nki.language, nki.isa) resolve to tern's."""
    mod = sys.modules[__name__]
    sys.modules.setdefault("nki", mod)
    sys.modules.setdefault("nki.language", language)
    sys.modules.setdefault("nki.isa", isa)
