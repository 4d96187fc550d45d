"""nki.language for tern: tensors, buffers, dtypes, tile sizes, ranges and
convenience wrappers. Names follow the public NKI API (nki 0.3-0.6)."""
import builtins
import copy as _copy
import dataclasses as _dataclasses
import functools as _functools
import math
import typing as _typing

from tern import _core
from tern.nki import _hoist
from tern.nki import _tracer

# ---------------------------------------------------------------- dtypes
float32 = "float32"
tfloat32 = "tfloat32"
bfloat16 = "bfloat16"
float16 = "float16"
float8_e4m3fn = "float8_e4m3fn"
float8_e5m2 = "float8_e5m2"
float8_e4m3 = "float8_e4m3"  # the IEEE-like E4M3 of Trn1/Trn2
float8_e8m0fnu = "float8_e8m0fnu"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float8_e5m2_x4 = "float8_e5m2_x4"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"
int8, uint8, int16, uint16, int32, uint32 = "int8", "uint8", "int16", "uint16", "int32", "uint32"
bool_ = "uint8"


# ------------------------------------------ buffers, tensors, operators
from tern.nki._tensor import (  # noqa: E402,F401
    Buffer as _Buffer, NkiTensor, arange, ds, hbm, hbm_tensor, mgrid, par_dim, private_hbm, psum,
    row_major as _row_major, sbuf, shared_hbm)
from tern.nki import _functions  # noqa: E402
from tern.nki import _ops  # noqa: E402

_Op = _ops.Op
globals().update({k: v for k, v in _ops.ALL.items()
                  if k not in ("abs", "max", "min", "sum", "all", "any", "copy")})
copy_fn = _ops.ALL["copy"]


def _unique_hbm_name(tr, name):
    taken = {d[0] for d in tr.hbm_decls}
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


class BlockTile:
    """A tile with block dims before its partition dim (legacy NKI shapes
    like (n, nl.par_dim(128), 512)): n tiles of [128, 512] side by side in
    the free dim; indexing the block dims gives the tile."""

    def __init__(self, blocks, inner, tile):
        self._blocks, self._inner, self._tile = tuple(blocks), tuple(inner), tile

    @property
    def shape(self):
        return self._blocks + self._inner

    dtype = property(lambda self: self._tile.dtype)
    buffer = property(lambda self: self._tile.buffer)
    ndim = property(lambda self: len(self.shape))

    def _block(self, idx):
        flat = 0
        for i, n in zip(idx, self._blocks):
            i = int(i)
            if not 0 <= i < n:
                raise IndexError(f"block index {i} out of range for {n} blocks")
            flat = flat * n + i
        per = math.prod(self._inner[1:])
        t = self._tile[:, flat * per:(flat + 1) * per]
        return t.reshape(self._inner)

    def _split(self, key):
        key = key if isinstance(key, tuple) else (key,)
        nb = len(self._blocks)
        if len(key) < nb or builtins.any(isinstance(k, slice) or k is Ellipsis for k in key[:nb]):
            raise NotImplementedError("not supported: slicing the block dims of a block tile; index each block")
        return self._block(key[:nb]), key[nb:]

    def __getitem__(self, key):
        t, rest = self._split(key)
        return t[rest] if rest else t

    def __setitem__(self, key, value):
        t, rest = self._split(key)
        t[rest if rest else ...] = value


def ndarray(shape, dtype=None, buffer=None, name=None, address=None, **hints):
    """New, uninitialized memory. HBM buffers become the kernel's HBM tensors
    (shared_hbm ones are outputs when returned); SBUF/PSUM tiles keep the
    partition dim first, or nl.par_dim marks it after block dims. `address`
    (start partition, byte offset) places an SBUF / PSUM tile there (it may
    alias other placed tiles; tern's own placements keep clear of it)."""
    tr = _tracer.current()
    dtype = _dtype_name(dtype if dtype is not None else float32)
    buffer = buffer if buffer is not None else sbuf
    buffer = getattr(buffer, "_tern_buffer", buffer)  # nki.compiler allocators
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    lead = next((i for i, s in enumerate(shape) if isinstance(s, par_dim)), 0)
    shape = tuple(int(s) for s in shape)
    if not shape or builtins.any(s < 1 for s in shape):
        raise ValueError(f"nl.ndarray shape {shape}: every dim must be >= 1 ({_tracer.kernel_location()})")
    if buffer in (hbm, shared_hbm, private_hbm):
        order = tr.hbm_counter
        tr.hbm_counter += 1
        # shared (and plain) HBM: the same tensor for every program of a launch
        # grid; private_hbm: each program its own.
        key = (order, tr.program_id) if buffer is private_hbm else order
        if key in tr.hbm_by_order:
            return tr.hbm_by_order[key]
        name = _unique_hbm_name(tr, name or f"hbm{order}")
        base = tr.declare_hbm(name, shape, dtype, buffer is shared_hbm)
        t = hbm_tensor(base, buffer, dtype, shape, name)
        tr.hbm_by_order[key] = t
        return t
    if lead and buffer in (sbuf, psum):
        blocks, inner = shape[:lead], shape[lead:]
        whole = ndarray((inner[0], math.prod(blocks) * math.prod(inner[1:])), dtype, buffer, name)
        return BlockTile(blocks, inner, whole)
    if buffer not in (sbuf, psum):
        raise ValueError(f"unknown buffer {buffer!r} ({_tracer.kernel_location()})")
    free = math.prod(shape[1:])
    b = tr.at()
    if address is not None:  # the kernel places the tile: (start partition, byte offset)
        p0, byte = (0, int(address)) if isinstance(address, int) else (int(address[0]), int(address[1]))
        base = b.place("sbuf" if buffer is sbuf else "psum", p0, byte, shape[0], free, dtype)
        t = NkiTensor(base, buffer, dtype, 0, shape[0], 0, _row_major(shape), name, 0,
                      _tracer.Allocation(tr, base, free, dtype))
        return t
    tr.free_dead()
    base = b.sbuf(shape[0], free, dtype) if buffer is sbuf else b.psum(shape[0], free, dtype)
    return NkiTensor(base, buffer, dtype, 0, shape[0], 0, _row_major(shape), name, 0,
                     _tracer.Allocation(tr, base, free, dtype))


def _dtype_name(dtype):
    """NKI dtypes are strings; numpy dtypes and types map to their names."""
    if isinstance(dtype, str):
        return dtype
    import numpy as np
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    return {"bool": "uint8", "float64": "float32"}.get(name, name)


# ----------------------------------------------------------- tile sizes
class _TileSize:
    """nl.tile_size for the target chip."""

    def _chip(self):
        tr = _tracer._current
        return tr.chip if tr is not None else _core.load_chip(_tracer.target_name())

    @property
    def pmax(self):
        return self._chip().sbuf_partitions

    @property
    def sbuf_min_align(self):
        """Byte alignment of a tile's start in an SBUF partition."""
        return self._chip().sbuf_min_align

    @property
    def psum_min_align(self):
        """Byte alignment of a tile's start in a PSUM partition."""
        return self._chip().psum_min_align

    @property
    def psum_fmax(self):
        return self._chip().psum_bank_bytes // 4

    @property
    def gemm_stationary_fmax(self):
        return self._chip().stationary_fmax

    @property
    def gemm_moving_fmax(self):
        return self._chip().moving_fmax

    @property
    def bn_stats_fmax(self):
        return self._chip().bn_stats_fmax

    @property
    def total_available_sbuf_size(self):
        """SBUF bytes per partition a kernel may allocate."""
        return self._chip().sbuf_partition_bytes

    @property
    def psum_num_banks(self):
        return self._chip().psum_banks

    bn_stats_dim = 6
    bn_aggr_dim = 2


tile_size = _TileSize()


# ---------------------------------------------------------------- ranges
def affine_range(*args, **hints):
    """Compile-time loop (unrolled while tracing); hints such as
    directives= or precise_schedule= are the compiler's. Instructions of
    its body whose inputs do not change between iterations are issued once
    (the compiler's loop-invariant code motion; _hoist.py)."""
    return _hoist.Loop(*args)


def sequential_range(*args, **hints):
    """A loop whose iterations depend on each other (unrolled while
    tracing, loop-invariant instructions hoisted as in affine_range)."""
    return _hoist.Loop(*args)


def static_range(*args, **hints):
    """A loop the compiler unrolls: its body is part of the enclosing loop's."""
    return builtins.range(*args)


@_tracer.status("partial: unrolled while tracing (a register bound is resolved then); the sequencer's loop "
                "instructions are not timed")
def dynamic_range(*args, **hints):
    """A loop the hardware runs with a register counter; tern traces its
    body once per iteration (results identical; docs/nki.md). Bounds may be
    registers (nisa.register_alloc / register_load)."""
    return builtins.range(*(int(a) for a in args))


def range_(*args):
    return builtins.range(*args)


@_tracer.status("partial: unrolled while tracing (register bounds resolved then)")
def fori_loop(lower, upper, body_fun, step=1):
    """body_fun(i) for i from lower to upper (exclusive); bounds may be registers."""
    from tern.nki import _registers
    _registers.fori_loop(lower, upper, body_fun, step)


@_tracer.status("partial: unrolled while tracing (the condition register resolved at each iteration)")
def while_loop(init, body_fun):
    """r = init; while r != 0: r = body_fun(r), r a condition register."""
    from tern.nki import _registers
    _registers.while_loop(init, body_fun)


def program_id(axis=0):
    """This program's index along launch-grid axis `axis` (0 without a grid)."""
    return _tracer.current().program_index(int(axis))


def num_programs(axes=None):
    """Programs along grid axis `axes` (an int or a tuple of axes, their
    product); None: every program of the launch grid (1 without one)."""
    tr = _tracer.current()
    grid = tr.grid or (1,)
    if axes is None:
        return math.prod(grid)
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    for a in axes:
        if not 0 <= a < len(grid):
            raise ValueError(f"num_programs(axes={a}): the launch grid {list(grid)} has {len(grid)} axes")
    return math.prod(grid[a] for a in axes)


def program_ndim():
    """How many axes the launch grid has (0 without one)."""
    return len(_tracer.current().grid)


class NKIObject:
    """Base of the plain Python classes kernels pass around while tracing
    (configuration objects). Without @dataclass it still builds like one:
    keyword arguments become attributes, annotated fields left out take
    their class default (or None, also under @dataclass), and
    __post_init__ runs. Plain class
    attributes count as fields too, also under @dataclass (NKI's tracer
    treats `x = None` like `x: Any = None`)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__", {})
        for n, hint in own.items():  # a field left out of the constructor is None, also under @dataclass
            if n not in cls.__dict__ and "ClassVar" not in str(hint):
                setattr(cls, n, None)
        plain = [n for n, v in cls.__dict__.items()
                 if not n.startswith("__") and n not in own and not callable(v)
                 and not isinstance(v, (staticmethod, classmethod, property))]
        if not plain:
            return
        annotations = dict(own)
        for n in plain:
            annotations[n] = _typing.Any
            v = cls.__dict__[n]
            if isinstance(v, (list, dict, set)):  # @dataclass refuses mutable defaults: a fresh copy each
                setattr(cls, n, _dataclasses.field(default_factory=_functools.partial(_copy.copy, v)))
        cls.__annotations__ = annotations

    def __init__(self, *args, **kwargs):
        fields = [n for c in reversed(type(self).__mro__) for n in getattr(c, "__annotations__", {})]
        fields = list(dict.fromkeys(fields))
        for name, value in zip(fields, args):
            kwargs.setdefault(name, value)
        for name in fields:
            if name not in kwargs:
                default = getattr(type(self), name, None)
                if isinstance(default, _dataclasses.Field):
                    default = default.default_factory()
                setattr(self, name, default)
        for name, value in kwargs.items():
            setattr(self, name, value)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()


class _NoReorder:
    """nl.no_reorder(): a block whose instructions keep program order. tern's
    engines run each instruction stream in program order already."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        return iter(())


def no_reorder():
    return _NoReorder()


# -------------------------------------------------------- convenience
def _isa():
    from tern.nki import isa
    return isa


def load(src, dtype=None, mask=None, mode=None, **hints):
    """A new SBUF tile holding src (DMA); masked-off elements are not read."""
    t = ndarray(src.shape, dtype or src.dtype, buffer=sbuf)
    _functions.for_boxes(mask, lambda r: _functions.each(
        lambda d, s: _isa().dma_copy(dst=d, src=s, oob_mode=mode), _functions.restrict(t, r),
        _functions.restrict(src, r)))
    if src.is_hbm and not _is_masked(mask):
        t._origin = src
    return t


def _tensor_empty():
    from tern.nki import _tensor
    return _tensor.Empty


def _is_masked(mask):
    return mask is not None and mask is not True


def store(dst, value, mask=None, **hints):
    """dst <- value (DMA); masked-off elements are not written."""
    if isinstance(value, (int, float)):
        value = full(dst.shape, value, dst.dtype)
    if value.shape != dst.shape:
        value = _functions.fit(value, dst.shape, engines=False) if value.size != dst.size else value
    _functions.for_boxes(mask, lambda r: _functions.each(
        lambda d, s: _isa().dma_copy(dst=d, src=s), _functions.restrict(dst, r), _functions.restrict(value, r)))


def load_transpose2d(src, dtype=None, mask=None):
    """src [F, P] from HBM into an SBUF tile [P, F] (DMA transpose for 2-byte
    types, else a load and a Tensor-engine transpose)."""
    from tern import _core
    if _core.dtype_size(src.dtype) == 2 and dtype in (None, src.dtype):
        t = ndarray((src.shape[1], src.shape[0]), src.dtype, buffer=sbuf)
        _isa().dma_transpose(dst=t, src=src)
        return t
    x = load(src, mask=mask)
    return copy(_functions.transpose(x), dtype=dtype or src.dtype)


class _Copy(_ops.Op):
    """nl.copy: a tile copy (tensor_copy, exact for equal dtypes) and, as an
    op value, the identity activation."""

    def __call__(self, src, dtype=None, mask=None, **hints):
        t = ndarray(src.shape, dtype or src.dtype, buffer=sbuf)
        _functions.for_boxes(mask, lambda r: _isa().tensor_copy(dst=_functions.restrict(t, r),
                                                                 src=_functions.restrict(src, r)))
        return t


copy = _Copy("copy", act="identity", kind="unary")


def zeros(shape, dtype=None, buffer=None, name=None, **hints):
    return full(shape, 0.0, dtype, buffer=buffer, name=name)


def ones(shape, dtype=None, buffer=None, name=None, **hints):
    return full(shape, 1.0, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype=None, buffer=None, name=None, **hints):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if isinstance(t, BlockTile):
        _isa().memset(dst=t._tile, value=fill_value)
    elif t.is_hbm:
        _isa().dma_copy(dst=t, src=full(t.shape, fill_value, t.dtype))
    else:
        _isa().memset(dst=t, value=fill_value)
    return t


def empty_like(x, dtype=None, buffer=None, name=None):
    return ndarray(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


def zeros_like(x, dtype=None, buffer=None, name=None):
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or sbuf, name=name)


def ones_like(x, dtype=None, buffer=None, name=None):
    return ones(x.shape, dtype or x.dtype, buffer=buffer or sbuf, name=name)


def full_like(x, fill_value, dtype=None, buffer=None, name=None):
    return full(x.shape, fill_value, dtype or x.dtype, buffer=buffer or sbuf, name=name)


def matmul(x, y, transpose_x=False, mask=None, **hints):
    """x @ y into PSUM (FP32): x is [K, M] with transpose_x=True, else [M, K]."""
    return _functions.matmul(x, y, transpose_x=transpose_x, mask=mask)


def transpose(x, dtype=None, mask=None, **hints):
    """x [P, F] -> [F, P] (PSUM, Tensor engine)."""
    return _functions.transpose(x, dtype=dtype, mask=mask)


def mean(x, axis, dtype=None, keepdims=False, mask=None):
    """The mean over free axes: the sum times 1 / count (Vector engine)."""
    s = _functions.reduce(_ops.ALL["sum"], x, axis, dtype=float32, keepdims=keepdims, mask=mask)
    n = math.prod(x.shape[a] for a in _functions._axes(axis, x.ndim))
    return _functions.binary(_ops.ALL["multiply"], s, 1.0 / n, dtype=dtype or x.dtype)


def where(condition, x, y, dtype=None, mask=None):
    """x where condition is non-zero, else y (y a tile or a scalar)."""
    shape = condition.shape
    out = ndarray(shape, dtype or (x.dtype if isinstance(x, NkiTensor) else float32), buffer=sbuf)
    if isinstance(y, NkiTensor):
        _functions.assign(out, y)
    else:
        _isa().memset(dst=out, value=float(y))
    src = x if isinstance(x, NkiTensor) else full(shape, float(x), out.dtype)
    _isa().tensor_copy_predicated(dst=out, src=_functions.fit(src, shape), predicate=condition)
    return out


def loop_reduce(x, op, loop_indices=None, dtype=None, mask=None, name=None):
    """Accumulation across the given loops' iterations: assigned to a
    destination (`dst[...] = nl.loop_reduce(x, np.add, [k])`), it makes
    dst = op(dst, x) (the destination is the op's other input, so it holds
    the initial value)."""
    return _functions.LoopReduce(x, _ops.resolve(op), dtype)


def shared_constant(constant, dtype=None, **hints):
    """An HBM tensor initialized with a host array's values (rounded to dtype)."""
    import numpy as np
    arr = np.asarray(constant)
    tr = _tracer.current()
    dt = _dtype_name(dtype or getattr(constant, "nki_dtype", None) or arr.dtype)
    name = _unique_hbm_name(tr, f"__constant{len(tr.constants)}")
    shape = arr.shape or (1,)
    base = tr.declare_hbm(name, shape, dt, False)
    tr.constants.append((name, arr.reshape(shape), dt))
    return hbm_tensor(base, hbm, dt, tuple(shape), name)


def shared_identity_matrix(n, dtype=None, **hints):
    """The n x n identity as an SBUF tile (a matmul operand for transposes),
    one per program, size and dtype. It sits at the top of each partition,
    clear of the low addresses kernels that place their own tiles use."""
    import numpy as np
    tr = _tracer.current()
    n, dt = int(n), _dtype_name(dtype or float32)
    cache = tr.__dict__.setdefault("identities", {})
    key = (n, dt, tr.program_id)
    if key not in cache:
        align = tr.chip.sbuf_min_align
        row = -(-n * _core.dtype_size(dt) // align) * align
        below = builtins.sum(t.extent for k, t in cache.items() if k[2] == tr.program_id)
        t = ndarray((n, n), dt, buffer=sbuf, address=(0, tr.chip.sbuf_partition_bytes - below - row))
        t.extent = row
        _isa().dma_copy(dst=t, src=shared_constant(np.eye(n, dtype=np.float32), dt))
        cache[key] = t
    return cache[key]


class _FP32:
    min = -3.4028234663852886e38
    max = 3.4028234663852886e38


fp32 = _FP32()


class finfo:
    """nl.finfo(dtype): min / max / tiny / eps of a float dtype."""

    _INFO = {"float32": (3.4028234663852886e38, 1.1920928955078125e-07, 1.1754943508222875e-38),
             "bfloat16": (3.3895313892515355e38, 0.0078125, 1.1754943508222875e-38),
             "float16": (65504.0, 0.0009765625, 6.103515625e-05),
             "float8_e4m3": (240.0, 0.125, 0.015625), "float8_e4m3fn": (448.0, 0.125, 0.015625),
             "float8_e5m2": (57344.0, 0.25, 6.103515625e-05)}

    def __init__(self, dtype):
        mx, self.eps, self.tiny = self._INFO[_dtype_name(dtype)]
        self.max, self.min, self.dtype = mx, -mx, dtype


def static_cast(array, dtype):
    """A host array converted to `dtype` (numpy)."""
    import numpy as np
    return np.asarray(array).astype(_dtype_name(dtype))


class _Spmd:
    """A launch-grid extent: nl.nc(2) (cores of a logical core) or
    nl.spmd_dim(...) (a product of extents)."""

    def __init__(self, extents):
        self.extents = tuple(extents)


def nc(n):
    return _Spmd((int(n),))


def spmd_dim(*dims):
    out = []
    for d in dims:
        out += list(d.extents) if isinstance(d, _Spmd) else [int(d)]
    return _Spmd((math.prod(out),))


def device_print(prefix, x):
    """Prints `prefix` and x's values after the kernel runs (functional runs):
    the tile is copied to a hidden HBM output when this line executes."""
    tr = _tracer.current()
    name = f"__print{len(tr.prints)}_p{tr.program_id}"
    if x.buffer is psum:  # DMA cannot read PSUM: stage through SBUF
        x = copy(x, dtype=float32)
    base = tr.declare_hbm(name, x.shape, x.dtype, True)
    _isa().dma_copy(dst=hbm_tensor(base, shared_hbm, x.dtype, x.shape, name), src=x)
    tr.prints.append((prefix, name, x.shape))


@_tracer.status("partial: rate 0.0 and 1.0 only (no model of the hardware's random numbers)")
def dropout(x, rate, dtype=None, mask=None, **hints):
    """x with each element zeroed with probability `rate`."""
    t = ndarray(x.shape, dtype or x.dtype, buffer=sbuf)
    _isa().dropout(dst=t, data=x, prob=rate)
    return t


def broadcast_to(src, shape=None, **hints):
    """A new SBUF tile: src broadcast to `shape` by numpy's rules (size-1
    dims repeated; a 1-partition tile onto every partition)."""
    return src.broadcast_to(shape if shape is not None else hints["shape"])


@_tracer.status("partial: issued as max, subtract, exp, sum and divide (the same values, their time)")
def softmax(x, axis, dtype=None, compute_dtype=None, mask=None, **hints):
    """exp(x - max(x)) / sum(exp(x - max(x))) along the free axis `axis`."""
    ops = _ops.ALL
    m = ops["max"](x, axis=axis, keepdims=True)
    e = ops["exp"](ops["subtract"](x, m, dtype=float32))
    return ops["divide"](e, ops["sum"](e, axis=axis, keepdims=True), dtype=dtype or x.dtype)


def gather_flattened(data, indices, axis=0, dtype=None, mask=None, **hints):
    """A new tile of indices' shape: each partition's values of data (its
    free dims flattened) at that partition's indices (uint32; GpSimd)."""
    if int(axis) != 0:
        raise NotImplementedError(f"not supported: gather_flattened(axis={axis}); axis=0 gathers along the "
                                  "flattened free dims")
    out = ndarray(indices.shape, dtype or data.dtype, buffer=sbuf)
    _isa().nc_n_gather(dst=out, data=data, indices=indices)
    return out


_RANDOM = ("partial: XORWOW per partition on the Vector engine; seeding and float conversion are tern's "
           "(reproducible, not the hardware's bits)")


@_tracer.status(_RANDOM)
def rand(shape, dtype=float32, buffer=None, name="", **hints):
    """A new tile of uniform random values in [0, 1)."""
    from tern.nki import _isa_random
    t = ndarray(shape, dtype, buffer=buffer or sbuf)
    _isa_random.uniform(t, 0.0, 1.0)
    return t


@_tracer.status(_RANDOM)
def random_seed(seed, mask=None, **hints):
    """Seeds rand() (the Vector engine's generator) from a [1, 1] tile or a
    32-bit int."""
    if not isinstance(seed, NkiTensor):
        value = int(seed)
        seed = ndarray((1, 1), uint32, buffer=sbuf)
        _isa().memset(dst=seed, value=value)
    _isa().set_rng_seed(seed)


@_tracer.status("partial: programs exchange through an HBM scratch tensor and a core barrier (each program "
                "its own core: a launch grid no larger than the chip's cores); reduced in program order")
def all_reduce(x, op, program_axes, dtype=None, mask=None, parallel_reduce=True, asynchronous=False, **hints):
    """The reduction of x (a tile) over the programs along `program_axes`
    of the launch grid; every one of them gets the result."""
    tr = _tracer.current()
    grid = tuple(tr.grid) or (1,)
    axes = sorted({program_axes} if isinstance(program_axes, int) else set(program_axes))
    if builtins.any(not 0 <= a < len(grid) for a in axes):
        raise ValueError(f"all_reduce(program_axes={program_axes}): the launch grid {list(grid)} has "
                         f"{len(grid)} axes ({_tracer.kernel_location()})")
    if tr.programs > tr.cores:
        raise NotImplementedError(f"not supported: all_reduce in a launch grid of {tr.programs} programs on "
                                  f"{tr.cores} cores (programs sharing a core cannot wait for each other)")
    me = [program_id(a) for a in builtins.range(len(grid))]
    group = []
    for flat in builtins.range(tr.programs):  # the programs that differ from this one only along `axes`
        idx, rest = [], flat
        for extent in reversed(grid):
            idx.insert(0, rest % extent)
            rest //= extent
        if builtins.all(idx[a] == me[a] for a in builtins.range(len(grid)) if a not in axes):
            group.append(flat)
    slots = ndarray((tr.programs,) + tuple(x.shape), x.dtype, buffer=shared_hbm)
    store(slots[tr.program_id], x)
    _isa().core_barrier(slots, cores=group)
    acc = load(slots[group[0]], dtype=dtype or x.dtype)
    for q in group[1:]:
        acc = _ops.resolve(op)(acc, load(slots[q]), dtype=dtype or x.dtype)
    return acc

# Names that shadow Python builtins inside this module are bound last.
globals()["range"] = range_
globals()["bool"] = bool_
globals()["abs"] = _ops.ALL["abs"]
globals()["max"] = _ops.ALL["max"]
globals()["min"] = _ops.ALL["min"]
globals()["sum"] = _ops.ALL["sum"]
globals()["all"] = _ops.ALL["all"]
globals()["any"] = _ops.ALL["any"]
