"""nki.language for tern: tensors, buffers, dtypes, tile sizes, ranges and
convenience wrappers. Names follow the public NKI API (nki 0.3-0.6)."""
import math

from tern import _core
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


# --------------------------------------------------------------- buffers
class _Buffer:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"nl.{self.name}"


sbuf = _Buffer("sbuf")
psum = _Buffer("psum")
hbm = _Buffer("hbm")
shared_hbm = _Buffer("shared_hbm")
private_hbm = _Buffer("private_hbm")


# ------------------------------------------------------- ops and functions
class _Op:
    """An ALU operator or activation function, passed to nki.isa calls."""

    def __init__(self, name, alu=None, act=None):
        self.name, self.alu, self.act = name, alu, act

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"not supported: nl.{self.name}(...) as a tile-level function (tern does not implement it "
            "yet); use the nki.isa call (e.g. nisa.activation or nisa.tensor_tensor)")

    def __repr__(self):
        return f"nl.{self.name}"


add = _Op("add", alu="add")
subtract = _Op("subtract", alu="subtract")
multiply = _Op("multiply", alu="multiply")
divide = _Op("divide", alu="divide")
maximum = _Op("maximum", alu="max")
minimum = _Op("minimum", alu="min")
equal = _Op("equal", alu="is_equal")
not_equal = _Op("not_equal", alu="not_equal")
greater = _Op("greater", alu="is_gt")
greater_equal = _Op("greater_equal", alu="is_ge")
less = _Op("less", alu="is_lt")
less_equal = _Op("less_equal", alu="is_le")
power = _Op("power", alu="pow")
bitwise_and = _Op("bitwise_and", alu="bitwise_and")
bitwise_or = _Op("bitwise_or", alu="bitwise_or")
bitwise_xor = _Op("bitwise_xor", alu="bitwise_xor")
left_shift = _Op("left_shift", alu="shift_left")
right_shift = _Op("right_shift", alu="shift_right")
abs_max = _Op("abs_max", alu="abs_max")

exp = _Op("exp", act="exp")
log = _Op("log", act="log")
tanh = _Op("tanh", act="tanh")
sigmoid = _Op("sigmoid", act="sigmoid")
gelu = _Op("gelu", act="gelu")
gelu_apprx_tanh = _Op("gelu_apprx_tanh", act="gelu_tanh")
silu = _Op("silu", act="silu")
silu_dx = _Op("silu_dx", act="silu_dx")
gelu_dx = _Op("gelu_dx", act="gelu_dx")
relu = _Op("relu", act="relu")
rsqrt = _Op("rsqrt", act="rsqrt")
sqrt = _Op("sqrt", act="sqrt")
square = _Op("square", act="square")
reciprocal = _Op("reciprocal", act="reciprocal")
copy_fn = _Op("copy", act="identity")
identity = copy_fn


# ----------------------------------------------------------------- tensors
class ds:
    """nl.ds(start, size): a dynamic-slice descriptor, the slice [start, start + size)."""

    def __init__(self, start, size):
        self.start, self.size = int(start), int(size)


class NkiTensor:
    """A tensor or a view of one: an allocation (C++ Tensor) plus the first
    partition/row, the element offset and a (stride, count) per free dim."""

    def __init__(self, base, buffer, dtype, p0, np_, off, free, name=None, row_stride=0, alloc=None):
        self._base, self.buffer, self.dtype = base, buffer, dtype
        self._alloc = alloc  # SBUF/PSUM: keeps the memory alive while any view exists
        self._row_stride = row_stride  # HBM: elements between consecutive rows of dim 0
        self._p0, self._np, self._off, self._free = p0, np_, off, list(free)
        self.name = name

    @property
    def shape(self):
        return (self._np,) + tuple(c for _, c in self._free)

    @property
    def ndim(self):
        return 1 + len(self._free)

    def _tensor(self):
        """The C++ view handed to the builder."""
        if self._alloc is not None:
            self._alloc.check_live()
        elif self.name is not None and self.buffer in (hbm, shared_hbm, private_hbm):
            _tracer.current().touched[-1].add(self.name)  # a collective's part waits for it
        free = self._free if self._free else [(1, 1)]
        return self._base.view(self._p0, self._np, self._off, free, self._row_stride)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > self.ndim:
            raise IndexError(f"{len(key)} indices for a {self.ndim}-d tensor of shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - len(key))
        p0, np_, off, free = self._p0, self._np, self._off, []

        def bounds(k, n, what):
            if isinstance(k, ds):
                k = slice(k.start, k.start + k.size)
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step <= 0 or stop <= start:
                    raise IndexError(f"empty or reversed slice {k} of {what} size {n}")
                return start, (stop - start + step - 1) // step, step, True
            i = int(k)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"index {k} out of range for {what} size {n}")
            return i, 1, 1, False

        start, count, step, _ = bounds(key[0], self._np, "the partition dim")
        if step != 1:
            raise NotImplementedError("not supported: a stepped slice of the partition dim (partitions are contiguous)")
        p0, np_ = p0 + start, count
        for k, (stride, n) in zip(key[1:], self._free):
            start, count, step, keep = bounds(k, n, "a free dim")
            off += start * stride
            if keep:
                free.append((stride * step, count))
        return NkiTensor(self._base, self.buffer, self.dtype, p0, np_, off, free, self.name, self._row_stride, self._alloc)

    def ap(self, pattern, offset=0):
        """A raw access pattern: pattern [[stride, count], ...] in elements (the
        first entry is the partition / row dim), offset in elements from this
        view's start."""
        if not pattern:
            raise ValueError("ap(pattern=...) needs at least the partition entry")
        pstride, parts = pattern[0]
        free = [(int(s), int(c)) for s, c in pattern[1:]]
        hbm_like = self.buffer in (hbm, shared_hbm, private_hbm)
        # HBM rows may have any stride (0 repeats one row on every partition);
        # SBUF/PSUM partitions are contiguous.
        row_stride = int(pstride) if hbm_like else self._row_stride
        return NkiTensor(self._base, self.buffer, self.dtype, self._p0, int(parts), self._off + int(offset),
                         free, self.name, row_stride, self._alloc)

    def reshape(self, shape):
        shape = tuple(int(s) for s in shape)
        if shape[0] != self._np or math.prod(shape[1:]) != math.prod(c for _, c in self._free):
            raise ValueError(f"cannot reshape {self.shape} into {shape} (the partition dim stays)")
        if any(True for i in range(len(self._free) - 1) if self._free[i][0] != self._free[i + 1][0] * self._free[i + 1][1]):
            raise NotImplementedError("not supported: reshape of a non-contiguous view")
        strides, acc = [], 1
        for c in reversed(shape[1:]):
            strides.append(acc)
            acc *= c
        return NkiTensor(self._base, self.buffer, self.dtype, self._p0, self._np, self._off,
                         list(zip(reversed(strides), shape[1:])), self.name, self._row_stride, self._alloc)

    def __repr__(self):
        return f"NkiTensor({self.buffer.name}, shape={self.shape}, dtype={self.dtype})"


def _row_major(shape):
    strides, acc = [], 1
    for c in reversed(shape[1:]):
        strides.append(acc)
        acc *= c
    return list(zip(reversed(strides), shape[1:]))


def hbm_tensor(base, buffer, dtype, shape, name):
    """The NkiTensor of a whole row-major HBM allocation."""
    return NkiTensor(base, buffer, dtype, 0, shape[0], 0, _row_major(shape), name, math.prod(shape[1:]))


def ndarray(shape, dtype, buffer=sbuf, name=None):
    """New, uninitialized memory. HBM buffers become the kernel's HBM tensors
    (shared_hbm ones are outputs when returned); SBUF/PSUM tiles keep the
    partition dim first."""
    tr = _tracer.current()
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"nl.ndarray shape {shape}: every dim must be >= 1")
    if buffer in (hbm, shared_hbm, private_hbm):
        order = tr.hbm_counter
        tr.hbm_counter += 1
        if order in tr.hbm_by_order:  # the same tensor for every program of a launch grid
            return tr.hbm_by_order[order]
        name = name or f"hbm{order}"
        base = tr.declare_hbm(name, shape, dtype, buffer is shared_hbm)
        t = hbm_tensor(base, buffer, dtype, shape, name)
        tr.hbm_by_order[order] = t
        return t
    if buffer not in (sbuf, psum):
        raise ValueError(f"unknown buffer {buffer!r}")
    free = math.prod(shape[1:])
    b = tr.at()
    base = b.sbuf(shape[0], free, dtype) if buffer is sbuf else b.psum(shape[0], free, dtype)
    return NkiTensor(base, buffer, dtype, 0, shape[0], 0, _row_major(shape), name, 0, _tracer.Allocation(tr, base))


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
    def psum_num_banks(self):
        return self._chip().psum_banks

    bn_stats_dim = 6
    bn_aggr_dim = 2


tile_size = _TileSize()


# ---------------------------------------------------------------- ranges
def affine_range(*args):
    """Compile-time loop (unrolled while tracing)."""
    return range(*args)


sequential_range = affine_range
static_range = affine_range


fori_loop = _tracer.not_yet("nl.fori_loop")
while_loop = _tracer.not_yet("nl.while_loop")
no_reorder = _tracer.not_yet("nl.no_reorder")


def program_id(axis=0):
    if axis != 0:
        raise NotImplementedError("not supported: launch grids with more than one axis")
    return _tracer.current().program_id


def num_programs(axis=0):
    if axis != 0:
        raise NotImplementedError("not supported: launch grids with more than one axis")
    return _tracer.current().programs


# -------------------------------------------------------- convenience
def load(src, dtype=None):
    """A new SBUF tile holding src (DMA)."""
    from tern.nki import isa
    t = ndarray(src.shape, dtype or src.dtype, buffer=sbuf)
    isa.dma_copy(dst=t, src=src)
    return t


def store(dst, value):
    """dst <- value (DMA)."""
    from tern.nki import isa
    isa.dma_copy(dst=dst, src=value)


def copy(src, dtype=None):
    """A new SBUF tile with src's values (tensor_copy)."""
    from tern.nki import isa
    t = ndarray(src.shape, dtype or src.dtype, buffer=sbuf)
    isa.tensor_copy(dst=t, src=src)
    return t


def zeros(shape, dtype, buffer=sbuf, name=None):
    return full(shape, 0.0, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=sbuf, name=None):
    from tern.nki import isa
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    isa.memset(dst=t, value=fill_value)
    return t


def matmul(x, y, transpose_x=False):
    """x @ y into a new PSUM tile: x.T @ y with transpose_x=True (x is [K, M])."""
    from tern.nki import isa
    if not transpose_x:
        raise NotImplementedError("not supported: nl.matmul(transpose_x=False): pass x already transposed ([K, M])")
    out = ndarray((x.shape[1], y.shape[1]), float32, buffer=psum)
    isa.nc_matmul(dst=out, stationary=x, moving=y)
    return out


def device_print(prefix, x):
    """Prints `prefix` and x's values after the kernel runs (functional runs):
    the tile is copied to a hidden HBM output when this line executes."""
    from tern.nki import isa
    tr = _tracer.current()
    name = f"__print{len(tr.prints)}_p{tr.program_id}"
    if x.buffer is psum:  # DMA cannot read PSUM: stage through SBUF
        x = copy(x, dtype=float32)
    base = tr.declare_hbm(name, x.shape, x.dtype, True)
    isa.dma_copy(dst=hbm_tensor(base, shared_hbm, x.dtype, x.shape, name), src=x)
    tr.prints.append((prefix, name, x.shape))
