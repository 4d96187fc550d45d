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
import sys

from tern import _core
from tern.nki import _io
from tern.nki import _kernel
from tern.nki import collectives  # noqa: F401
from tern.nki import isa  # noqa: F401
from tern.nki import language  # noqa: F401

TernError = _core.TernError
Kernel = _kernel.Kernel
typed, spec, per_rank = _kernel.typed, _kernel.spec, _kernel.per_rank
Bits, to_float32 = _io.Bits, _io.to_float32


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
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
    return Kernel(fn, platform_target, grid, "both", trace, None, ranks, system)


def benchmark(kernel, platform_target=None, timing_only=True, trace=None, dtypes=None, ranks=None,
              system=None):
    """tern.nki.benchmark(kernel)(*args): the simulated latency and profile
    summary (a dict); timing_only skips the data (inputs only give shapes).
    With ranks=N: each rank's time and the collectives as they ran."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
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
