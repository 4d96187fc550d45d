"""tern.nki: run NKI kernels written in Python on tern's simulated chip.

    import tern.nki as nki
    import tern.nki.language as nl
    import tern.nki.isa as nisa

    @nki.jit
    def kernel(a, b): ...          # the public NKI API
    out = kernel(a_np, b_np)        # traced, simulated, results in the kernel's dtypes

Unmodified kernel files run after `tern.nki.install()` (or `import
tern.nki.as_nki`): `import nki` (and nki.language, nki.isa, ...) resolves
to this package, `import neuronxcc.nki` (the legacy generation) to
tern.nki.legacy. The target follows NEURON_PLATFORM_TARGET_OVERRIDE (trn1,
trn2, trn3; default trn3) or `platform_target=`.
"""
import sys

from tern import _core
from tern.nki import _io
from tern.nki import _kernel
from tern.nki import collectives  # noqa: F401
from tern.nki import compiler  # noqa: F401
from tern.nki import isa  # noqa: F401
from tern.nki import language  # noqa: F401
from tern.nki import tensor  # noqa: F401
from tern.nki import typing  # noqa: F401

TernError = _core.TernError
Kernel = _kernel.Kernel
typed, spec, per_rank = _kernel.typed, _kernel.spec, _kernel.per_rank
Bits, to_float32 = _io.Bits, _io.to_float32
dtype = str  # nki.dtype: NKI dtypes are their names ("bfloat16", ...)


def _kernel_of(kernel, **kw):
    """A Kernel for `kernel` (a Kernel keeps its function and grid)."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
    target = kw.pop("platform_target", None) or (kernel.platform_target if isinstance(kernel, Kernel) else None)
    kw.setdefault("strict_reads", kernel.strict_reads if isinstance(kernel, Kernel) else False)
    return Kernel(fn, target, grid, **kw)


def jit(fn=None, *, platform_target=None, mode=None, strict_reads=False, **_compiler_options):
    """@nki.jit / @nki.jit(...): trace at call time, simulate, return the
    results (mode= and compiler options are the NKI compiler's).
    strict_reads=True makes a read of SBUF/PSUM no instruction wrote an
    error (by default it reads what the memory holds, as the hardware)."""
    if fn is None:
        return lambda f: Kernel(f, platform_target, strict_reads=strict_reads)
    return Kernel(fn, platform_target, strict_reads=strict_reads)


def simulate(kernel, platform_target=None, ranks=None, system=None, trace=None):
    """nki.simulate(kernel)(*args, **kwargs): functional results (and
    kernel.last, the profile). nki.simulate(kernel)[2](...) launches a grid.
    With ranks=N the kernel runs on N chips of `system` (default: the
    smallest system of the target's chips holding N) and the call returns a
    list of the N ranks' results; nki.collectives move data between them."""
    return _kernel_of(kernel, platform_target=platform_target, mode="both", trace=trace, ranks=ranks,
                      system=system)


cpu_simulate = simulate


def simulate_kernel(kernel, *args, **kwargs):
    """nki.simulate_kernel(kernel[grid], *args): the legacy call form."""
    return _kernel_of(kernel)(*args, **kwargs)


def baremetal(kernel=None, **_artifact_options):
    """nki.baremetal(kernel) / @nki.baremetal(save_neff_name=...): run on
    the simulated chip (artifact options name files tern does not write)."""
    if kernel is None:
        return lambda f: _kernel_of(f)
    return _kernel_of(kernel)


class _Latency:
    def __init__(self, latency_us):
        self._us = latency_us

    def get_latency_percentile(self, percentile=50):
        """Microseconds: the simulator's one deterministic latency for every percentile."""
        return self._us


class _BenchmarkResult:
    def __init__(self, summary):
        self.nc_latency = _Latency(summary["latency_us"])
        self.summary = summary


class _Benchmarked:
    """nki.benchmark(kernel)(*args): timing only (inputs give shapes and
    dtypes; nki.spec or nki.typing.tensor[[shape], dtype] stand for them):
    returns the profile summary and keeps .benchmark_result."""

    def __init__(self, kernel, **kw):
        self._kernel, self._kw, self.benchmark_result = kernel, kw, None

    def __getitem__(self, grid):
        return _Benchmarked(_kernel_of(self._kernel)[grid], **self._kw)

    def __call__(self, *args, **kwargs):
        timing_only = self._kw.get("timing_only", True)
        k = _kernel_of(self._kernel, platform_target=self._kw.get("platform_target"),
                       mode="timing" if timing_only else "both", trace=self._kw.get("trace"),
                       dtypes=self._kw.get("dtypes"), ranks=self._kw.get("ranks"), system=self._kw.get("system"))
        out = k(*args, **kwargs)
        summary = out if timing_only else k.last
        if k.ranks is None and "latency_us" in summary:
            self.benchmark_result = _BenchmarkResult(summary)
        return summary


def benchmark(kernel=None, platform_target=None, timing_only=True, trace=None, dtypes=None, ranks=None,
              system=None, **_legacy_options):
    """tern.nki.benchmark(kernel)(*args): the simulated latency and profile
    summary (a dict); timing_only skips the data. Also the legacy decorator
    @nki.benchmark(warmup=, iters=, ...): `.benchmark_result.nc_latency`.
    With ranks=N: each rank's time and the collectives as they ran."""
    kw = dict(platform_target=platform_target, timing_only=timing_only, trace=trace, dtypes=dtypes, ranks=ranks,
              system=system)
    if kernel is None:
        return lambda f: _Benchmarked(f, **kw)
    return _Benchmarked(kernel, **kw)


profile = benchmark


def install():
    """Make `import nki` (the current API: nki.language, nki.isa, ...) and
    `import neuronxcc.nki` (the legacy one) resolve to tern's."""
    from tern.nki import isa_enums
    from tern.nki import legacy
    mod = sys.modules[__name__]
    names = {"nki": mod, "nki.language": language, "nki.isa": isa, "nki.isa.constants": isa_enums,
             "nki.collectives": collectives, "nki.typing": typing, "nki.compiler": compiler,
             "nki.tensor": tensor}
    names.update(legacy.modules())
    for name, m in names.items():
        sys.modules.setdefault(name, m)
