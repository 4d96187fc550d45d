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
from tern.nki import collectives  # noqa: F401
from tern.nki import _collectives
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


class per_rank(list):
    """Inputs that differ by rank: `nki.per_rank([a0, a1, ...])` gives rank r
    the array a[r] (other inputs are the same on every rank)."""


class Kernel:
    """A traced-and-simulated NKI kernel: call it like a function."""

    def __init__(self, fn, platform_target=None, grid=1, mode="both", trace=None, dtypes=None,
                 ranks=None, system=None):
        self.fn, self.platform_target, self.grid = fn, platform_target, grid
        self.mode, self.trace_path, self.dtypes = mode, trace, dtypes or {}
        self.ranks, self.system = ranks, system  # ranks None: one rank, results not listed
        self.last = None  # summary of the last run

    def __getitem__(self, grid):
        """kernel[2](...): a launch grid of logical cores (program ids 0..n-1)."""
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise NotImplementedError("not supported: launch grids with more than one axis")
            grid = grid[0]
        return Kernel(self.fn, self.platform_target, int(grid), self.mode, self.trace_path, self.dtypes,
                      self.ranks, self.system)

    def _trace(self, chip, rank, ranks, args, kwargs):
        """Traces the kernel for one rank: (trace, result, [(input name, array)])."""
        names = list(inspect.signature(self.fn).parameters)
        tr = _tracer.Trace(chip, self.grid, rank, ranks)
        inputs = []
        with tr:
            tensor_args = []
            for i, a in enumerate(args):
                if isinstance(a, per_rank):
                    if len(a) != ranks:
                        raise ValueError(f"argument {i}: nki.per_rank of {len(a)} arrays for {ranks} ranks")
                    a = a[rank]
                if isinstance(a, spec) and self.mode != "timing":
                    raise ValueError("nki.spec inputs carry no data: use them with nki.benchmark (timing only)")
                if isinstance(a, (np.ndarray, spec)):
                    name = names[i] if i < len(names) else f"arg{i}"
                    dt = _input_dtype(a, self.dtypes.get(name))
                    shape = a.shape if a.ndim > 0 else (1,)
                    base = tr.declare_hbm(name, shape, dt, False)
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
            tr.finish()
        outs = result if isinstance(result, (tuple, list)) else (() if result is None else (result,))
        for o in outs:
            if not isinstance(o, nl.NkiTensor) or o.buffer is not nl.shared_hbm:
                raise TypeError("a kernel returns nl.shared_hbm tensors (nl.ndarray(..., buffer=nl.shared_hbm))")
        return tr, result, inputs

    def __call__(self, *args, **kwargs):
        chip = _core.load_chip(_tracer.target_name(self.platform_target))
        ranks = self.ranks or 1
        traced = [self._trace(chip, r, ranks, args, kwargs) for r in range(ranks)]
        if self.ranks is None and not traced[0][0].collectives:
            return self._run_one(chip, *traced[0])
        return self._run_ranks(chip, traced)

    def _run_one(self, chip, tr, result, inputs):
        """One program on one chip: the instruction-level profile and trace."""
        program = tr.segments[0]
        outs = result if isinstance(result, (tuple, list)) else (() if result is None else (result,))
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

    def _run_ranks(self, chip, traced):
        """Every rank's parts on its own chip, the collectives between them on
        a runtime System (docs/nki.md, "Collectives"): launched when the part
        before them ends, waited for by a rank before its first later part
        that touches their tensors, or at the end."""
        ranks = len(traced)
        first = traced[0][0]
        for r, (tr, _, _) in enumerate(traced[1:], 1):
            _collectives.check_same(first.collectives, tr.collectives, r)
        name = self.system or _core.smallest_system(chip.name, ranks)
        if name is None:
            raise ValueError(f"no system of {chip.name} chips holds {ranks} ranks; name one with system=")
        system = _core.System(name, ranks)
        data = self.mode != "timing"
        carried = [dict() for _ in range(ranks)]  # rank -> tensor name -> raw bytes
        updates = [dict() for _ in range(ranks)]  # rank -> tensor name -> values a collective delivered
        summaries = [[] for _ in range(ranks)]
        sims = [None] * ranks
        in_flight = []

        def settle(r, names=None):
            for c in in_flight:
                if r in c.members and (names is None or c.names & names):
                    c.settle(system, r, updates)

        def value(r, operand):
            if not data:
                return _collectives.zeros(operand)
            got = updates[r].get(operand["name"])
            return got if got is not None else sims[r].read(operand["name"])

        parts = len(first.segments)
        for k in range(parts):
            for r, (tr, _, inputs) in enumerate(traced):
                settle(r, tr.touched[k])
                sim = _core.Simulator(chip)
                sim.load(tr.segments[k])
                if data:
                    if k == 0:
                        for n, a in inputs:
                            sim.write(n, np.ascontiguousarray(a, dtype=np.float32).reshape(-1))
                    for n, b in carried[r].items():
                        sim.write_bytes(n, b)
                    for n, v in updates[r].items():
                        sim.write(n, v)
                    updates[r] = {}
                summary, _ = sim.run(self.mode, False)
                summaries[r].append(summary)
                system.advance(r, summary["latency_ns"], f"part {k}")
                if data:
                    carried[r] = {d[0]: sim.read_bytes(d[0])
                                  for d in tr.hbm_decls[:tr.segment_hbm[k]]}
                sims[r] = sim
            if k + 1 < parts:
                rec = first.collectives[k]
                names = {o["name"] for pair in rec["operands"] for o in pair}
                for r in range(ranks):  # a tensor still in flight is read or rewritten
                    settle(r, names)
                in_flight += _collectives.launch(system, rec, k, value)
        for r in range(ranks):
            settle(r)
        clocks = [system.clock(r) for r in range(ranks)]
        self.last = {
            "ranks": ranks, "system": name, "parts": parts,
            "latency_ns": max(clocks), "latency_us": max(clocks) / 1e3,
            "rank_latency_ns": clocks,
            "part_latency_ns": [[s["latency_ns"] for s in rs] for rs in summaries],
            "collectives": system.events(),
        }
        if self.trace_path:
            system.write_trace(self.trace_path)
        if not data:
            return self.last
        results = []
        for r, (tr, result, _) in enumerate(traced):
            sim = sims[r]
            for n, v in updates[r].items():  # delivered after the last part that ran
                sim.write(n, v)
            for prefix, pname, shape in tr.prints:
                print(f"[rank {r}]", prefix, sim.read(pname).reshape(shape))
            outs = result if isinstance(result, (tuple, list)) else (() if result is None else (result,))
            arrays = tuple(sim.read(o.name).reshape(o.shape) for o in outs)
            results.append(arrays[0] if isinstance(result, nl.NkiTensor) else arrays)
        return results if self.ranks is not None else results[0]


def jit(fn=None, *, platform_target=None, **_ignored):
    """@nki.jit: trace at call time, simulate, return numpy arrays."""
    if fn is None:
        return lambda f: Kernel(f, platform_target)
    return Kernel(fn, platform_target)


def simulate(kernel, platform_target=None, ranks=None, system=None, trace=None):
    """nki.simulate(kernel)(*args): functional results as numpy arrays.
    With ranks=N the kernel runs on N chips of `system` (default: the smallest
    system of the target's chips holding N) and the call returns a list of the
    N ranks' results; nki.collectives move data between them."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else 1
    return Kernel(fn, platform_target, grid, "both", trace, None, ranks, system)


def benchmark(kernel, platform_target=None, timing_only=True, trace=None, dtypes=None, ranks=None,
              system=None):
    """tern.nki.benchmark(kernel)(*args): the simulated latency and profile
    summary (a dict); timing_only skips the data (inputs only give shapes).
    With ranks=N: each rank's time and the collectives as they ran."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else 1
    k = Kernel(fn, platform_target, grid, "timing" if timing_only else "both", trace, dtypes, ranks,
               system)

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
    sys.modules.setdefault("nki.collectives", collectives)
