"""The tracing state of the kernel being built (one at a time)."""
import os
import sys

from tern import _core

_current = None


def current():
    """The active trace; NKI calls outside a @nki.jit kernel are errors."""
    if _current is None:
        raise RuntimeError("nki calls are only valid inside a kernel run by @nki.jit or nki.simulate")
    return _current


def not_yet(qualified):
    """A stand-in for an NKI call tern does not implement: it says so, by name."""
    def call(*args, **kwargs):
        raise NotImplementedError(f"not supported: {qualified} (tern does not implement it yet; see docs/nki.md)")
    call.__name__ = qualified.rsplit(".", 1)[-1]
    return call


def target_name(explicit=None):
    """The target chip: explicit, else NEURON_PLATFORM_TARGET_OVERRIDE, else trn3."""
    name = explicit or os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or "trn3"
    if name not in ("trn1", "trn2", "trn3"):
        raise ValueError(f"unknown NKI target '{name}': expected trn1, trn2 or trn3")
    return name


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def kernel_location():
    """file:line of the innermost caller outside the tern package."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_PACKAGE_DIR):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class Allocation:
    """An SBUF/PSUM allocation shared by a tile and its views. When the last
    of them goes away (the kernel's Python variable is rebound or goes out of
    scope), the memory returns to the builder, which orders its next users
    after every use of this one."""

    def __init__(self, trace, base):
        self.trace, self.base = trace, base
        self.matmul_written = set()  # views of this PSUM tile a matmul already wrote

    def __del__(self):
        if _current is self.trace and self.trace.open:
            self.trace.builder.release(self.base)


class Trace:
    def __init__(self, chip, programs):
        self.chip = chip
        self.builder = _core.Builder(chip, programs, 1)
        self.programs = programs
        self.program_id = 0
        self.hbm_outputs = []  # (name, ndarray) in creation order
        self.hbm_by_order = {}  # creation index -> ndarray, shared by all programs
        self.hbm_counter = 0
        self.matmul_targets = set()  # PSUM regions already written by a matmul
        self.open = True
        self.prints = []  # (prefix, hidden HBM output, shape) of nl.device_print

    def __enter__(self):
        global _current
        if _current is not None:
            raise RuntimeError("a kernel is already being traced")
        _current = self
        return self

    def __exit__(self, *exc):
        global _current
        self.open = False
        _current = None
        return False

    def at(self):
        """Points the builder at the kernel line making the current call."""
        self.builder.set_location(kernel_location())
        return self.builder
