"""nki.isa calls that order the cores and engines rather than compute:
core_barrier and sendrecv between the programs of a logical core, and the
engine sequencers' registers (values resolved while tracing; _registers.py)."""
from tern import _core
from tern.nki import _hoist
from tern.nki import _registers
from tern.nki import _tracer


def _engine(engine, default):
    from tern.nki import isa
    return isa._engine(engine, default)


def _core_of(rank):
    """The core of program `rank` of the launch grid (LNC: the physical cores
    of a logical core are programs 0 and 1)."""
    tr = _tracer.current()
    rank = int(rank)
    if not 0 <= rank < max(tr.programs, 1):
        raise ValueError(f"rank {rank} is not a program of the launch grid {list(tr.grid) or [1]} "
                         f"({_tracer.kernel_location()})")
    return rank % tr.cores


def _next_sync(kind):
    tr = _tracer.current()
    counts = tr.__dict__.setdefault("_sync_counts", {})
    k = (tr.program_id, kind)
    counts[k] = counts.get(k, 0) + 1
    return f"{kind}#{counts[k]}"


def core_barrier(data, cores=(0, 1), engine=None, name=None):
    """Every program in `cores` reaches this point before any goes on: this
    core's writes of `data` before the barrier are seen by the others' reads
    after it (the engine's sequencer waits on the other cores' semaphores).
    A launch of one program (LNC=1) has no other core to wait for: the
    barrier then only orders this core's own accesses."""
    tr = _tracer.current()
    cores = [cores] if isinstance(cores, int) else list(cores)
    if tr.programs <= 1:
        cores = [c for c in cores if int(c) == tr.program_id]
    me = tr.program_id
    key = _next_sync("barrier")
    eng = _engine(engine, _core.Engine.gpsimd)
    b = tr.at()
    b.core_sync(eng, [], [data._tensor()])
    b.sync_point(key)
    peers = [_core_of(c) for c in cores if int(c) != me]
    if peers:
        b.sync_wait(eng, key, peers, [data._tensor()])


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id=0, use_gpsimd_dma=False, name=None):
    """Sends this program's SBUF `src` to program send_to_rank's `dst` and
    receives program recv_from_rank's `src` into this `dst` (a DMA between
    the cores' SBUFs); calls with the same pipe_id pair up in order."""
    tr = _tracer.current()
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(f"sendrecv: src {src.shape} {src.dtype} and dst {dst.shape} {dst.dtype} differ "
                         f"({_tracer.kernel_location()})")
    n = _next_sync(f"sendrecv{int(pipe_id)}")
    to, frm = _core_of(send_to_rank), _core_of(recv_from_rank)
    b = tr.at()
    eng = _core.Engine.gpsimd
    # src written, dst free: dst counts as written here, so this waits for the
    # reads of an earlier message in it too (a reused receive buffer).
    _hoist.wrote(dst)
    b.core_sync(eng, [dst._tensor()], [src._tensor()])
    b.sync_point(n + ":ready")
    b.sync_operand(n + ":dst", dst._tensor())
    # The DMA below runs on another engine's queue: src counts as written by
    # this wait, so the DMA (which reads src) starts only after it.
    b.sync_wait(eng, n + ":ready", [to], [src._tensor()])
    b.dma_to_core(n + ":dst", src._tensor(), to, _core.Engine.gpsimd if use_gpsimd_dma else _core.Engine.sync)
    b.sync_point(n + ":sent")
    b.sync_wait(eng, n + ":sent", [frm], [dst._tensor()])


VirtualRegister = _registers.VirtualRegister

_REGISTERS = ("partial: values are resolved while tracing (the kernel is simulated up to each register_load); "
              "loops over registers are unrolled, the sequencer's branch instructions are not timed")


@_tracer.status(_REGISTERS)
def register_alloc(x=None):
    """A new virtual register holding x (an int or a register), else 0."""
    return _registers.alloc(x)


@_tracer.status(_REGISTERS)
def register_move(dst, src=None, imm=None):
    """dst <- src (a constant int or another register)."""
    return _registers.move(dst, imm if src is None else src)


@_tracer.status(_REGISTERS)
def register_load(dst, src):
    """dst <- the 32-bit scalar in src (SBUF or HBM)."""
    return _registers.load(dst, src)


@_tracer.status(_REGISTERS)
def register_store(dst, src):
    """dst (SBUF or HBM) <- the value of register src."""
    _registers.store(dst, src)




NkiScalar = VirtualRegister


@_tracer.status(_REGISTERS)
def scalar_load(src, dtype=None):
    """A scalar holding the value of the 1x1 tile src (resolved while tracing)."""
    return _registers.load(_registers.alloc(), src)


@_tracer.status(_REGISTERS)
def scalar_store(dst, src):
    """The 1x1 tile dst <- the scalar (or register, or int) src."""
    _registers.store(dst, src)
