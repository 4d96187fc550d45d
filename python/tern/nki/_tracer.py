"""The tracing state of the kernel being built (one at a time)."""
import math
import os
import sys
import weakref

from tern import _core
from tern.nki import isa_enums

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
    call.__nki_status__ = "not yet"
    return call


def status(text):
    """Declares a call's support in the API table (docs/nki.md): "partial: ..."."""
    def mark(fn):
        fn.__nki_status__ = text
        return fn
    return mark


def is_hwdge(mode):
    """Whether an NKI dge_mode asks for the hardware descriptor generator."""
    return mode is not None and int(mode) == int(isa_enums.dge_mode.hwdge)


class hardware_dge:
    """Within the block, the builder's DMA copies and transposes take their
    descriptors from the hardware DGE (dge_mode.hwdge), timed by tern's DMA
    model as the generator's time before the transfer; otherwise (unknown,
    none, swdge) they are timed as descriptors built before the run."""

    def __init__(self, builder, mode):
        self.builder = builder
        self.on = is_hwdge(mode)

    def __enter__(self):
        if self.on:
            self.builder.set_hardware_dge(True)
        return self.builder

    def __exit__(self, *exc):
        if self.on:
            self.builder.set_hardware_dge(False)
        return False


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

    def __init__(self, trace, base, free=0, dtype=None):
        self.trace, self.base, self.free = trace, base, free  # free: elements per partition
        self.dtype = dtype
        self.matmul_mask = None  # [partitions, free] elements a matmul wrote (PSUM)
        self.builder = trace.builder  # a collective starts a new one (Trace.cut)
        self.matmul_written = set()  # views of this PSUM tile a matmul already wrote
        self.seq = trace.alloc_seq  # creation order: the same in every trace of the kernel
        trace.alloc_seq += 1
        self.core = trace.program_id % max(trace.cores, 1)
        self.released = False
        self.version = 0  # writes so far (_hoist.py: a loop-invariant result stays valid until one)
        trace.note_use(self)
        if trace.lifetimes is not None:
            trace.live.append(weakref.ref(self))

    def release(self):
        if not self.released:
            self.released = True
            self.builder.release(self.base)

    def check_live(self):
        """SBUF and PSUM do not survive a collective: tern runs a kernel's parts
        between its collectives as programs of their own. A tile freed after
        its recorded last use (free_dead) is never named again: its memory
        may hold another tile."""
        if self.released:
            raise RuntimeError(f"internal: a tile is used after its last use in the traced lifetimes "
                               f"({kernel_location()}); its memory may already hold another tile")
        if self.builder is not self.trace.builder:
            raise NotImplementedError(
                f"not supported: an SBUF/PSUM tile used across a collective ({kernel_location()}); "
                "tern runs the kernel's parts between collectives as separate programs, so only HBM "
                "tensors carry over: store the tile to HBM before the collective and load it after")

    def __del__(self):
        if _current is self.trace and self.trace.open and self.builder is self.trace.builder:
            self.release()


class _Emitting:
    """The builder as at() hands it out while tiles' lifetimes matter: a call
    that emits an instruction marks the tiles named for it as used then."""
    _QUIET = frozenset(("sbuf", "psum", "place", "hbm", "release", "set_location", "set_core", "finish",
                        "sync_point", "sync_operand"))

    def __init__(self, trace):
        self._trace, self._builder = trace, trace.builder

    def __getattr__(self, name):
        attr = getattr(self._builder, name)
        if name in self._QUIET or not callable(attr):
            return attr

        def call(*args, **kwargs):
            result = attr(*args, **kwargs)
            self._trace.emitted()
            return result
        return call


class Trace:
    """One rank's kernel as it is traced. Collectives cut it into parts
    (`segments`): each part is a program of its own, `collectives[k]` runs
    between part k and part k + 1, and the HBM tensors carry over."""

    def __init__(self, chip, grid=(), rank=0, ranks=1):
        self.chip = chip
        self.grid = tuple(grid)  # the launch grid's extents, () without one
        self.programs = math.prod(self.grid)
        # Programs beyond the chip's cores run one after another on the cores
        # they share (program i on core i mod cores).
        self.cores = min(self.programs, chip.cores)
        self.overcommit = False  # set_overcommit(): a lifetimes-only trace
        self.builder = _core.Builder(chip, self.cores, 1)
        self.builder.set_psum_packing(True)
        self.builder.set_rotating_allocation(True)
        self.rank, self.ranks = rank, ranks
        self.hbm_decls = []  # (name, shape, dtype, output, base) in declaration order
        self.segments = []  # finished programs of the parts before each collective
        self.segment_hbm = []  # per part: how many of hbm_decls its program holds
        self.touched = [set()]  # per part: the HBM tensors its instructions access
        self.collectives = []
        self.program_id = 0  # the flat index of the program being traced (row-major over grid)
        self.hbm_outputs = []  # (name, ndarray) in creation order
        self.hbm_by_order = {}  # creation index -> ndarray, shared by all programs
        self.hbm_counter = 0
        self.matmul_targets = set()  # PSUM regions already written by a matmul
        self.open = True
        self.prints = []  # (prefix, hidden HBM output, shape) of nl.device_print
        self.constants = []  # (hidden HBM input, array, dtype) of nl.shared_constant
        self.register_values = []  # register_load results known so far (_registers.py)
        self.register_loads = 0
        # Tiles' lifetimes, as the NKI compiler allocates by liveness: each
        # at() is an event; an allocation's last use is the event of the last
        # instruction naming it. A trace that recorded them (recorded: seq ->
        # event) lets the next one free a tile after its last use even while
        # the kernel still holds it (lifetimes; live: weakrefs).
        self.at_count = 0
        self.alloc_seq = 0
        self.recorded = {}
        self.lifetimes = None
        self.live = []
        self.pending = set()  # seqs named since the last emitted instruction
        self.done = 0  # the event of the last emitted instruction
        # A legacy instruction held until the next one (_hoist.py): (tile, emit).
        self.deferred = None
        # The affine / sequential loops being traced, innermost last: each
        # one's loop-invariant results (_hoist.py).
        self.loops = []
        # [1, P] FP32 ones tiles, the stationary of partition broadcasts
        # (_functions.py), per (program part, P).
        self.ones_rows = {}

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
        if self.deferred is not None:
            self.flush()
        self.at_count += 1
        self.builder.set_location(kernel_location())
        return _Emitting(self) if self.lifetimes is not None or self.overcommit else self.builder

    def defer(self, tile, emit):
        """Holds the instruction that computes the new tile `tile` until the
        next instruction is issued (emit(view) issues it into view), so that
        `view[...] = nisa.op(...)` can write view directly."""
        self.flush()
        self.deferred = (tile, emit)

    def flush(self):
        if self.deferred is not None:
            tile, emit = self.deferred
            self.deferred = None
            emit(tile)

    def set_overcommit(self):
        self.overcommit = True
        self.builder.set_overcommit(True)

    def note_use(self, alloc):
        """A tile named by an instruction being built: its use counts once
        an instruction is emitted (_Emitting), so a tile converted for an
        instruction is never freed before it."""
        self.recorded[alloc.seq] = self.at_count
        self.pending.add(alloc.seq)

    def emitted(self):
        for seq in self.pending:
            self.recorded[seq] = self.at_count
        self.pending.clear()
        self.done = self.at_count

    def free_dead(self):
        """Releases the tiles whose last use (in the recorded lifetimes) is an
        instruction already emitted and that no instruction being built names."""
        if self.lifetimes is None:
            return
        core = self.program_id % max(self.cores, 1)
        keep = []
        for ref in self.live:
            a = ref()
            if a is None or a.released:
                continue
            last = self.lifetimes.get(a.seq)
            if a.core == core and a.builder is self.builder and last is not None and last <= self.done \
                    and a.seq not in self.pending:
                a.release()
            else:
                keep.append(ref)
        self.live = keep

    def declare_hbm(self, name, shape, dtype, output):
        """A named HBM tensor of the kernel (it carries over collectives)."""
        base = self.at().hbm(name, list(shape), dtype, output)
        self.hbm_decls.append((name, tuple(shape), dtype, output, base))
        return base

    def hbm_shape(self, name):
        for n, shape, dtype, _, _ in self.hbm_decls:
            if n == name:
                return shape, dtype
        return None, None

    def cut(self, record):
        """Ends the current part at a collective and starts the next: a new
        builder with the same HBM tensors at the same addresses."""
        self.flush()
        if self.programs != 1:
            raise NotImplementedError("not supported: collectives in a kernel with a launch grid "
                                      f"(grid {self.programs}); launch one program per rank")
        self.segments.append(self.builder.finish())
        self.segment_hbm.append(len(self.hbm_decls))
        self.collectives.append(record)
        self.touched.append(set())
        self.builder = _core.Builder(self.chip, self.cores, 1)
        self.builder.set_psum_packing(True)
        self.builder.set_rotating_allocation(True)
        self.builder.set_overcommit(self.overcommit)
        self.builder.set_core(0)
        for name, shape, dtype, output, base in self.hbm_decls:
            again = self.builder.hbm(name, list(shape), dtype, output)
            if repr(again) != repr(base):  # addresses follow declaration order
                raise RuntimeError(f"internal: HBM tensor {name} moved across a collective")

    def finish(self):
        """All parts' programs, the last one finished now."""
        self.flush()
        self.segments.append(self.builder.finish())
        self.segment_hbm.append(len(self.hbm_decls))
        return self.segments

    def program_index(self, axis):
        """The traced program's index along grid axis `axis`."""
        if not self.grid:
            if axis != 0:
                raise ValueError(f"program_id({axis}): the kernel has no launch grid")
            return 0
        if not 0 <= axis < len(self.grid):
            raise ValueError(f"program_id({axis}): the launch grid {list(self.grid)} has {len(self.grid)} axes")
        rest = self.program_id
        for extent in reversed(self.grid[axis + 1:]):
            rest //= extent
        return rest % self.grid[axis]
