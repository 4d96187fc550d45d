"""nki.compiler: the NKI compiler's directives and allocation controls.
tern schedules and allocates by itself (docs/nki.md), so decorators and
loop directives are accepted and change nothing, and the allocator objects
stand for the buffer they allocate from."""
import functools


def _identity_decorator(fn=None, **_options):
    if fn is None:
        return lambda f: f
    return fn


skip_middle_end_transformations = _identity_decorator
enable_stack_allocator = _identity_decorator
force_auto_alloc = _identity_decorator
disable_allocation_opt = _identity_decorator


class _Directive:
    def __init__(self, name, *args):
        self.name, self.args = name, args

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def no_reorder():
    return _Directive("no_reorder")


def multi_buffer(n):
    return _Directive("multi_buffer", n)


class _Allocator:
    """sbuf / psum allocation policies (mod_alloc, alloc): tern places the
    tiles itself; `buffer=ncc.sbuf.mod_alloc(...)` allocates from SBUF."""

    def __init__(self, name):
        self.name = name

    @property
    def _tern_buffer(self):
        from tern.nki import language as nl
        return nl.sbuf if self.name == "sbuf" else nl.psum

    def mod_alloc(self, *args, **kwargs):
        return self

    def alloc(self, *args, **kwargs):
        return self

    def auto_alloc(self, *args, **kwargs):
        return self


sbuf = _Allocator("sbuf")
psum = _Allocator("psum")
__all__ = ["skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc", "no_reorder",
           "multi_buffer", "sbuf", "psum"]
