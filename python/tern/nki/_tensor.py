"""NKI tensors and views (nl.ndarray, slicing, .ap, .reshape) and the
affine index expressions of nl.arange / nl.mgrid with the masks built from
them. A view is an allocation (C++ Tensor) plus the first partition / row,
an element offset and a (stride, count) per free dim; nothing here emits an
instruction."""
import math

from tern.nki import _ap_fields
from tern.nki import _tracer


class Buffer:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"nl.{self.name}"


sbuf = Buffer("sbuf")
psum = Buffer("psum")
hbm = Buffer("hbm")
shared_hbm = Buffer("shared_hbm")
private_hbm = Buffer("private_hbm")
HBM_BUFFERS = (hbm, shared_hbm, private_hbm)


class ds:
    """nl.ds(start, size): the slice [start, start + size) (size 0: empty)."""

    def __init__(self, start, size):
        self.start, self.size = int(start), int(size)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


class par_dim(int):
    """nl.par_dim(n) in a shape: marks the partition dim (legacy NKI)."""


class Empty(Exception):
    """An operand with no elements: the instruction using it does nothing."""


# ------------------------------------------------------- index expressions
class IndexVar:
    """One axis of an index grid: extent, and where it sits in the grid
    (axis of ndim), which orders the dims of an indexed view."""

    def __init__(self, extent, axis=0, ndim=1, uid=None):
        self.extent, self.axis, self.ndim = int(extent), axis, ndim
        self.uid = uid if uid is not None else object()

    def placed(self, axis, ndim):
        return IndexVar(self.extent, axis, ndim, self.uid)


class IndexExpr:
    """offset + sum(coeff * var): an affine index of nl.arange / nl.mgrid."""

    def __init__(self, terms, offset=0):
        self.terms, self.offset = dict(terms), int(offset)  # uid -> (var, coeff)

    @staticmethod
    def of(x):
        if isinstance(x, IndexExpr):
            return x
        if isinstance(x, (int, par_dim)) or (hasattr(x, "__index__") and not isinstance(x, float)):
            return IndexExpr({}, int(x))
        return None

    def _combine(self, other, sign):
        o = IndexExpr.of(other)
        if o is None:
            return NotImplemented
        terms = dict(self.terms)
        for uid, (v, c) in o.terms.items():
            prev = terms.get(uid, (v, 0))[1]
            terms[uid] = (v, prev + sign * c)
        return IndexExpr({u: t for u, t in terms.items() if t[1] != 0}, self.offset + sign * o.offset)

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        return (-self)._combine(other, 1)

    def __neg__(self):
        return IndexExpr({u: (v, -c) for u, (v, c) in self.terms.items()}, -self.offset)

    def __mul__(self, k):
        if isinstance(k, IndexExpr):
            if k.terms and self.terms:
                raise NotImplementedError("not supported: a product of two index expressions")
            k, e = (k.offset, self) if not k.terms else (self.offset, k)
            return e * k
        k = int(k)
        return IndexExpr({u: (v, c * k) for u, (v, c) in self.terms.items()}, self.offset * k)

    __rmul__ = __mul__

    def __getitem__(self, key):
        """arange(n)[:, None] / [None, :]: places a 1-D index on an axis."""
        if len(self.terms) != 1:
            raise NotImplementedError("not supported: reshaping an index expression of several indices")
        key = key if isinstance(key, tuple) else (key,)
        axes = [i for i, k in enumerate(key) if k is not None]
        if len(axes) != 1:
            raise IndexError(f"index expression [{key}]: expected one ':' and None elsewhere")
        (uid, (v, c)), = self.terms.items()
        return IndexExpr({uid: (v.placed(axes[0], len(key)), c)}, self.offset)

    @property
    def shape(self):
        dims = {v.axis: v.extent for v, _ in self.terms.values()}
        nd = max((v.ndim for v, _ in self.terms.values()), default=1)
        return tuple(dims.get(a, 1) for a in range(nd))

    def _pred(self, op, bound):
        return Predicate([(self - bound, op)])

    def __lt__(self, b):
        return self._pred("lt", b)

    def __le__(self, b):
        return self._pred("le", b)

    def __gt__(self, b):
        return self._pred("gt", b)

    def __ge__(self, b):
        return self._pred("ge", b)

    def __repr__(self):
        parts = [f"{c}*i{v.axis}[{v.extent}]" for v, c in self.terms.values()]
        return "IndexExpr(" + " + ".join(parts + [str(self.offset)]) + ")"


def arange(*args):
    """nl.arange(n) / nl.arange(start, stop): a 1-D index (start + i)."""
    r = range(*args)
    if r.step != 1:
        raise NotImplementedError("not supported: nl.arange with a step (scale the index instead)")
    v = IndexVar(len(r))
    return IndexExpr({v.uid: (v, 1)}, r.start)


class Grid(tuple):
    """nl.mgrid's indices: a tuple, also named by axis (.p, .x, .y, .z)."""
    p = property(lambda self: self[0])
    x = property(lambda self: self[1])
    y = property(lambda self: self[2])
    z = property(lambda self: self[3])


class _MGrid:
    """nl.mgrid[0:128, 0:512]: one index per axis of a dense grid."""

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        out = []
        for axis, k in enumerate(key):
            start, stop = (k.start or 0), k.stop
            if k.step not in (None, 1):
                raise NotImplementedError("not supported: nl.mgrid with a step")
            v = IndexVar(stop - start, axis, len(key))
            out.append(IndexExpr({v.uid: (v, 1)}, start))
        return Grid(out) if len(out) > 1 else out[0]


mgrid = _MGrid()


class Predicate:
    """A conjunction of affine conditions `expr op 0` (mask=...)."""

    def __init__(self, conds):
        self.conds = list(conds)

    def __and__(self, other):
        return Predicate(self.conds + other.conds)

    def __or__(self, other):
        raise NotImplementedError("not supported: a mask joined with '|' (tern takes conjunctions of "
                                  "bounds); split the operation or use nisa.affine_select")

    def ranges(self):
        """uid -> (var, lo, hi): the one box of index values the mask keeps."""
        boxes = self.boxes()
        if len(boxes) != 1:
            raise NotImplementedError("not supported: a mask that keeps more than one box of indices here "
                                      "(tern splits such masks for elementwise operations, loads and stores)")
        return boxes[0]

    def boxes(self):
        """The index values the mask keeps as disjoint boxes, each
        uid -> (var, lo, hi). Conditions on one index bound it; conditions
        on two indices (512 * i + j < n) are resolved for each value of the
        outer one, runs of equal bounds merging into a box."""
        single = {}
        pairs = []
        for e, op in self.conds:
            if len(e.terms) == 1:
                (uid, (v, c)), = e.terms.items()
                lo, hi = single.get(uid, (v, 0, v.extent))[1:]
                nlo, nhi = _bound(c, e.offset, op, v.extent)
                single[uid] = (v, max(lo, nlo), min(hi, nhi))
            elif len(e.terms) == 2:
                pairs.append((e, op))
            else:
                raise NotImplementedError("not supported: a mask condition on three or more indices")
        if not pairs:
            return [single]
        groups = {}
        for e, op in pairs:
            groups.setdefault(frozenset(e.terms), []).append((e, op))
        seen = set()
        for g in groups:
            if seen & g:
                raise NotImplementedError("not supported: mask conditions relating overlapping pairs of indices")
            seen |= g
        boxes = [dict(single)]
        for conds in groups.values():  # independent pairs: every combination of their boxes
            boxes = [{**b, **p} for b in boxes for p in _pair_boxes(conds, single)]
        return boxes


def _pair_boxes(pairs, single):
    """The boxes of two indices that conditions relating them keep."""
    (u1, (v1, _)), (u2, (v2, _)) = sorted(pairs[0][0].terms.items(), key=lambda t: -abs(t[1][1]))
    olo, ohi = single.get(u1, (v1, 0, v1.extent))[1:]
    runs, run = [], None
    for x in range(olo, ohi):
        lo, hi = single.get(u2, (v2, 0, v2.extent))[1:]
        for e, op in pairs:
            blo, bhi = _bound(e.terms[u2][1], e.offset + e.terms[u1][1] * x, op, v2.extent)
            lo, hi = max(lo, blo), min(hi, bhi)
        if hi <= lo:
            run = None
            continue
        if run is not None and run[1] == (lo, hi) and run[0][1] == x:
            run[0][1] = x + 1
            continue
        run = [[x, x + 1], (lo, hi)]
        runs.append(run)
    return [{u1: (v1, x0, x1), u2: (v2, lo, hi)} for (x0, x1), (lo, hi) in runs]


def _bound(c, o, op, extent):
    """[lo, hi) of integer i in [0, extent) with c * i + o  op  0."""
    lo, hi = 0, extent
    if c == 0:
        holds = {"lt": o < 0, "le": o <= 0, "gt": o > 0, "ge": o >= 0}[op]
        return (0, extent) if holds else (0, 0)
    if op in ("lt", "le"):
        lim = -o - (1 if op == "lt" else 0)  # c*i <= lim
        if c > 0:
            hi = min(hi, lim // c + 1)
        else:
            lo = max(lo, -(lim // -c))
    else:
        lim = -o + (1 if op == "gt" else 0)  # c*i >= lim
        if c > 0:
            lo = max(lo, -(-lim // c))
        else:
            hi = min(hi, (-lim) // (-c) + 1)
    return lo, hi


class Box:
    """One box of index values (a mask resolved for one instruction)."""

    def __init__(self, ranges):
        self._ranges = ranges

    def ranges(self):
        return self._ranges

    def boxes(self):
        return [self._ranges]


# ----------------------------------------------------------------- tensors
class NkiTensor:
    """A tensor or a view of one (see the module docstring). `_vars` names,
    per dim, the index variable an expression-indexed view came from (for
    masks), or None."""

    def __init__(self, base, buffer, dtype, p0, np_, off, free, name=None, row_stride=0, alloc=None,
                 vars_=None):
        self._base, self.buffer, self.dtype = base, buffer, dtype
        self._alloc = alloc  # SBUF/PSUM: keeps the memory alive while any view exists
        self._row_stride = row_stride  # HBM: elements between consecutive rows of dim 0
        self._p0, self._np, self._off, self._free = p0, np_, off, list(free)
        self.name = name
        self._vars = vars_
        self._limits = {}  # index variables whose full range leaves the tensor (a mask must bound them)
        self._origin = None  # an SBUF tile loaded whole from HBM: that view (partition broadcasts)

    def _like(self, p0, np_, off, free, row_stride=None, vars_=None):
        return NkiTensor(self._base, self.buffer, self.dtype, p0, np_, off, free, self.name,
                         self._row_stride if row_stride is None else row_stride, self._alloc, vars_)

    @property
    def shape(self):
        return (self._np,) + tuple(c for _, c in self._free)

    @property
    def ndim(self):
        return 1 + len(self._free)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def is_hbm(self):
        return self.buffer in HBM_BUFFERS

    def _tensor(self):
        """The C++ view handed to the builder (Empty when it has no elements)."""
        if self._alloc is not None:
            self._alloc.check_live()
            self._alloc.trace.note_use(self._alloc)
        elif self.name is not None and self.is_hbm:
            _tracer.current().touched[-1].add(self.name)  # a collective's part waits for it
        if self._np == 0 or any(c == 0 for _, c in self._free):
            raise Empty()
        if self._limits:
            raise IndexError(next(iter(self._limits.values()))[2])
        free = _ap_fields.split_long_dims(self._free) if self._free else [(1, 1)]
        return self._base.view(self._p0, self._np, self._off, free, self._row_stride)

    # ---------------------------------------------------------- indexing
    def _expand(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        while len(key) > self.ndim and (key[-1] in (0, -1) or key[-1] == slice(None) or key[-1] == slice(0, 1)):
            key = key[:-1]  # indices of trailing unit dims a view left out ([P] seen as [P, 1])
        if len(key) > self.ndim:
            raise IndexError(f"{len(key)} indices for a {self.ndim}-d tensor of shape {self.shape}")
        return key + (slice(None),) * (self.ndim - len(key))

    def __getitem__(self, key):
        if isinstance(key, Predicate):  # t[mask]: the part the mask keeps
            from tern.nki import _functions as F
            return F.restrict(self, key.ranges())
        key = self._expand(key)
        if any(isinstance(k, IndexExpr) and k.terms for k in key):
            return self._index_exprs(key)
        p0, off, free = self._p0, self._off, []
        start, count, step, keep0 = _bounds(key[0], self._np, "the partition dim")
        if step != 1 and count > 1:
            if not self.is_hbm:
                raise NotImplementedError("not supported: a stepped slice of the partition dim (partitions "
                                          "are contiguous)")
        row_stride = self._row_stride * step if self.is_hbm else self._row_stride
        for k, (stride, n) in zip(key[1:], self._free):
            s, c, st, keep = _bounds(k, n, "a free dim")
            off += s * stride
            if keep:
                free.append((stride * st, c))
        if self.is_hbm and not keep0 and free:
            # An integer index drops an HBM dim (numpy's rule): the next dim
            # becomes the rows.
            off += (p0 + start) * self._row_stride
            (rs, rn), free = free[0], free[1:]
            return self._like(0, rn, off, free, rs)
        return self._like(p0 + start, count, off, free, row_stride)

    def _index_exprs(self, key):
        """t[i_p, i_f] with nl.arange / nl.mgrid indices: one dim per index
        variable, ordered by its grid axis (slices keep their place)."""
        strides = [self._row_stride if self.is_hbm else None] + [s for s, _ in self._free]
        extents = self.shape
        off = self._off
        hbm_view = self.is_hbm
        p0 = 0 if hbm_view else self._p0
        if hbm_view:  # HBM rows fold into the offset: the row dim may get a new stride
            off += self._p0 * self._row_stride
        dims = []  # [uid, var, stride, count, tensor dim]
        limits = {}  # uid -> (lo, hi, message): the index values inside the tensor
        for d, k in enumerate(key):
            e = IndexExpr.of(k) if not isinstance(k, (slice, ds)) else None
            if e is not None and not e.terms:  # an integer
                s, _, _, _ = _bounds(e.offset, extents[d], "a dim")
                if d == 0 and not hbm_view:
                    p0 += s
                else:
                    off += s * strides[d]
                continue
            if e is None:
                s, c, st, _ = _bounds(k, extents[d], "a dim")
                if d == 0 and not hbm_view:
                    raise NotImplementedError("not supported: a slice of the partition dim mixed with index "
                                              "expressions; index it with nl.arange too")
                off += s * strides[d]
                dims.append([object(), None, strides[d] * st, c, d])
                continue
            lo = e.offset + sum(min(0, c * (v.extent - 1)) for v, c in e.terms.values())
            hi = e.offset + sum(max(0, c * (v.extent - 1)) for v, c in e.terms.values())
            if lo < 0 or hi >= extents[d]:
                msg = (f"index expression {e} reaches [{lo}, {hi}] outside dim {d} of size {extents[d]} "
                       f"({_tracer.kernel_location()}); a mask= must keep it inside")
                limits[len(limits)] = (dict(e.terms), e.offset, extents[d], msg)
            if d == 0 and not hbm_view:
                p0 += e.offset
            else:
                off += e.offset * strides[d]
            for uid, (v, c) in sorted(e.terms.items(), key=lambda t: t[1][0].axis):
                hit = next((x for x in dims if x[0] is uid), None)
                step = c * (1 if d == 0 and not hbm_view else strides[d])
                if hit is not None:
                    hit[2] += step
                else:
                    dims.append([uid, v, step, v.extent, d])
        # The view's partition / row dim is the index grid's first axis: the
        # index varying along it (for HBM wherever it is used: a transposed
        # access), or a dim of 1 when no index does (nl.mgrid[0:1, 0:n]).
        first = [x for x in dims if x[1] is not None and x[1].axis == 0]
        if hbm_view:
            part = first
        else:
            part = [x for x in dims if x[4] == 0 and x[1] is not None]
            if part and part[0][1].axis != 0 and first:
                raise NotImplementedError("not supported: an SBUF/PSUM partition index that is not the index "
                                          "grid's first axis (a transposed on-chip access)")
        if len(part) > 1:
            raise NotImplementedError("not supported: the partition dim indexed by two variables")
        pd = part[0] if part else [object(), None, 0 if hbm_view else 1, 1, 0]
        rest = [x for x in dims if x is not pd and not (x[1] is not None and x[3] == 1)]
        rest.sort(key=lambda x: (x[1].axis if x[1] is not None else -1))
        if not hbm_view and pd[2] != 1:
            raise NotImplementedError("not supported: a partition index with a coefficient (partitions are "
                                      "contiguous)")
        free = [(x[2], x[3]) for x in rest]
        vars_ = [pd[1]] + [x[1] for x in rest]
        t = self._like(p0, pd[3], off, free, pd[2] if hbm_view else None, vars_)
        t._limits = limits
        return t

    def __setitem__(self, key, value):
        from tern.nki import _functions
        _functions.assign(self[key], value)

    # ------------------------------------------------------- reshaping
    def ap(self, pattern, offset=0, dtype=None, scalar_offset=None, vector_offset=None, indirect_dim=0):
        """A raw access pattern: pattern [[stride, count], ...] in elements (the
        first entry is the partition / row dim), offset in elements from this
        view's start; dtype= reinterprets the bytes (strides then count
        elements of that type); scalar_offset / vector_offset (with
        indirect_dim) move the access by a value read from memory at run
        time (docs/nki.md)."""
        if not pattern:
            raise ValueError("ap(pattern=...) needs at least the partition entry")
        pstride, parts = pattern[0]
        free = [(int(s), int(c)) for s, c in pattern[1:]]
        # HBM rows may have any stride (0 repeats one row on every partition);
        # SBUF/PSUM partitions are contiguous.
        row_stride = int(pstride) if self.is_hbm else self._row_stride
        src = self._bitcast(dtype, rescale=False) if dtype is not None and dtype != self.dtype else self
        # The pattern and offset count elements of the view's (new) dtype.
        p0, off = src._p0, src._off + int(offset)
        if hasattr(scalar_offset, "_value"):  # a register: its value is known while tracing
            k = int(indirect_dim)
            dims = src._dims()
            if not 0 <= k < len(dims):
                raise ValueError(f"indirect_dim={k} for a view of {len(dims)} dims")
            off += int(scalar_offset) * (dims[k][0] if self.is_hbm or k else src._partition_stride())
            scalar_offset = None
        if self.is_hbm:  # the rows get their own stride: this view's first row folds into the offset
            p0, off = 0, off + src._p0 * src._row_stride
        per = src._partition_stride()
        if not self.is_hbm and per and not 0 <= off < per:
            # An on-chip offset counts the tensor's elements partition-major.
            p0, off = p0 + off // per, off % per
        t = src._like(p0, int(parts), off, free, row_stride)
        if scalar_offset is not None or vector_offset is not None:
            # indirect_dim counts the dims of this view (as reshaped), so its
            # stride is this view's, in the pattern's dtype.
            strides = [s for s, _ in src._dims()] if self.is_hbm else []
            t._indirect = (scalar_offset, vector_offset, int(indirect_dim), strides)
        return t

    def _bitcast(self, dtype, rescale=True):
        """The same bytes seen as `dtype`: offsets (and with rescale the dims:
        the contiguous innermost one holds old/new times the elements) in the
        new type's elements."""
        from tern import _core
        old, new = _core.dtype_size(self.dtype), _core.dtype_size(dtype)
        if (self._off * old) % new:
            raise ValueError(f"a view as {dtype}: the byte offset is not a multiple of {new}")
        free, row_stride = list(self._free), self._row_stride
        if rescale and old != new:
            if not free or free[-1][0] != 1 or (free[-1][1] * old) % new:
                raise ValueError(f"a view as {dtype}: the innermost dim must be contiguous and a whole number "
                                 f"of {dtype} elements")
            free = [(s * old // new, c) for s, c in free[:-1]] + [(1, free[-1][1] * old // new)]
            row_stride = row_stride * old // new if self.is_hbm else row_stride
        elif not rescale:
            row_stride = row_stride * old // new if self.is_hbm else row_stride
        base = self._base.retyped(dtype)
        pstride = self._partition_stride() * old // new if self._alloc is not None else 0
        t = NkiTensor(base, self.buffer, dtype, self._p0, self._np, self._off * old // new, free, self.name,
                      row_stride, self._alloc)
        t._pstride = pstride
        return t

    def view(self, dtype):
        """The same memory as another dtype (the innermost dim rescaled:
        an FP32 [P, n] view as FP8 is [P, 4n])."""
        return self._bitcast(dtype)

    def bitcast(self, dtype):
        return self._bitcast(dtype)

    def _contiguous(self):
        if self._np == 0:
            return True
        dims = ([(self._row_stride, self._np)] if self.is_hbm else []) + list(self._free)
        acc = 1
        for s, c in reversed(dims):
            if c != 1 and s != acc:
                return False
            acc *= c
        return True

    def reshape(self, shape):
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {shape}: {self.size} elements vs "
                             f"{math.prod(shape)}")
        if self.is_hbm:  # HBM has no partition dim: any row-major reshape of contiguous memory
            if not self._contiguous():
                raise NotImplementedError(f"not supported: reshape of a non-contiguous HBM view {self.shape}")
            off = self._off + self._p0 * self._row_stride
            return NkiTensor(self._base, self.buffer, self.dtype, 0, shape[0], off, row_major(shape),
                             self.name, math.prod(shape[1:]), None)
        if shape[0] != self._np:
            raise ValueError(f"cannot reshape SBUF/PSUM tile {self.shape} into {shape}: the partition dim "
                             "stays")
        if not _free_contiguous(self._free):
            raise NotImplementedError("not supported: reshape of a non-contiguous view")
        live = [(s, c) for s, c in self._free if c != 1]
        inner = live[-1][0] if live else 1
        free = [(s * inner, c) for s, c in row_major(shape)]
        return self._like(self._p0, self._np, self._off, free)

    def broadcast_to(self, shape):
        from tern.nki import _functions
        return _functions.broadcast_to(self, tuple(int(s) for s in shape))

    def expand_dims(self, axis):
        axis = axis % (self.ndim + 1)
        if axis == 0:
            raise NotImplementedError("not supported: a new leading dim (the partition dim stays)")
        free = list(self._free)
        free.insert(axis - 1, (0, 1))
        return self._like(self._p0, self._np, self._off, free)

    @property
    def T(self):
        from tern.nki import _functions
        return _functions.transpose(self)

    # ------------------------------------------------ tile arithmetic
    def _binop(name, reverse=False):
        def op(self, other):
            from tern.nki import _functions as F
            from tern.nki import _ops
            a, b = (other, self) if reverse else (self, other)
            return F.binary(_ops.ALL[name], a, b)
        return op

    def _inplace(name):
        def op(self, other):
            from tern.nki import _functions as F
            from tern.nki import _ops
            return F.inplace(_ops.ALL[name], self, other)
        return op

    __add__, __radd__, __iadd__ = _binop("add"), _binop("add", True), _inplace("add")
    __sub__, __rsub__, __isub__ = _binop("subtract"), _binop("subtract", True), _inplace("subtract")
    __mul__, __rmul__, __imul__ = _binop("multiply"), _binop("multiply", True), _inplace("multiply")
    __truediv__, __rtruediv__, __itruediv__ = _binop("divide"), _binop("divide", True), _inplace("divide")
    __pow__, __rpow__ = _binop("power"), _binop("power", True)
    __and__, __rand__, __iand__ = _binop("bitwise_and"), _binop("bitwise_and", True), _inplace("bitwise_and")
    __or__, __ror__, __ior__ = _binop("bitwise_or"), _binop("bitwise_or", True), _inplace("bitwise_or")
    __xor__, __rxor__ = _binop("bitwise_xor"), _binop("bitwise_xor", True)
    __lshift__, __rshift__ = _binop("left_shift"), _binop("right_shift")
    __lt__, __le__ = _binop("less"), _binop("less_equal")
    __gt__, __ge__ = _binop("greater"), _binop("greater_equal")
    __imax__ = _inplace("maximum")

    def __neg__(self):
        from tern.nki import _functions as F
        from tern.nki import _ops
        return F.unary(_ops.ALL["negative"], self)

    def __abs__(self):
        from tern.nki import _functions as F
        from tern.nki import _ops
        return F.unary(_ops.ALL["abs"], self)

    # ------------------------------------------------ view methods (nki 0.3+)
    def as_tile(self):
        return self

    def indirect(self, index, num_elem=None):
        """Tensor indirection over the free dim: column i of partition p is
        this tile's element at index[16 g + i % 16, i // 16] (g = p // 16, the
        partition's 16-partition group). tern gathers it with local_gather
        into a tile when the view is first read (docs/nki.md)."""
        return IndirectView(self, index, int(num_elem if num_elem is not None else index.size))

    def get_pattern(self):
        """[[stride, count], ...] in elements, the partition / row dim first."""
        first = self._row_stride if self.is_hbm else self._partition_stride()
        return [[first, self._np]] + [[s, c] for s, c in self._free]

    def _partition_stride(self):
        """Elements (of this view's dtype) from one partition to the next."""
        if getattr(self, "_pstride", 0):
            return self._pstride
        return int(getattr(self._alloc, "free", 0) or 0)

    def _dims(self):
        """[(stride, count)] of every dim (dim 0: row stride for HBM, 0 on chip)."""
        return [(self._row_stride if self.is_hbm else 0, self._np)] + list(self._free)

    def _with_dims(self, dims):
        if self.is_hbm:  # rows fold into the offset: any dim may become the row dim
            return self._like(0, dims[0][1], self._off + self._p0 * self._row_stride, dims[1:], dims[0][0])
        if dims[0][1] != self._np:
            raise NotImplementedError("not supported: changing the partition dim of an SBUF/PSUM view")
        return self._like(self._p0, self._np, self._off, dims[1:])

    def slice(self, dim, start=0, end=None, step=1):
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim, index):
        key = [slice(None)] * self.ndim
        key[dim] = index
        return self[tuple(key)]

    def permute(self, dims):
        dims = [int(d) for d in dims]
        cur = self._dims()
        if not self.is_hbm and dims[0] != 0:
            raise NotImplementedError("not supported: permuting the partition dim of an SBUF/PSUM view")
        return self._with_dims([cur[d] for d in dims])

    def broadcast(self, dim, size):
        cur = self._dims()
        if cur[dim][1] != 1:
            raise ValueError(f"broadcast(dim={dim}): the dim has size {cur[dim][1]}, not 1")
        if dim == 0 and not self.is_hbm:
            from tern.nki import _functions as F
            return F.broadcast_partitions(self, int(size))
        cur[dim] = (0, int(size))
        return self._with_dims(cur)

    def expand_dim(self, dim):
        cur = self._dims()
        if dim == 0:
            if not self.is_hbm:
                raise NotImplementedError("not supported: a new leading dim on an SBUF/PSUM view")
            return self._like(0, 1, self._off + self._p0 * self._row_stride, cur, 0)
        cur.insert(dim, (0, 1))
        return self._with_dims(cur)

    def squeeze_dim(self, dim):
        cur = self._dims()
        if cur[dim][1] != 1 or (dim == 0 and not (self.is_hbm and len(cur) > 1)):
            raise ValueError(f"squeeze_dim({dim}): only a dim of size 1 can go (an SBUF/PSUM view keeps "
                             "its partition dim)")
        del cur[dim]
        return self._with_dims(cur)

    def reshape_dim(self, dim, shape):
        cur = self._dims()
        s, c = cur[dim]
        shape = list(shape)
        if -1 in shape:
            known = math.prod(x for x in shape if x != -1)
            shape[shape.index(-1)] = c // known
        if math.prod(shape) != c:
            raise ValueError(f"reshape_dim({dim}, {shape}): the dim has {c} elements")
        if dim == 0 and not self.is_hbm and len(shape) > 1:
            raise NotImplementedError("not supported: splitting the partition dim of an SBUF/PSUM view")
        new, acc = [], s
        for n in reversed(shape):
            new.insert(0, (acc, n))
            acc *= n
        return self._with_dims(cur[:dim] + new + cur[dim + 1:])

    def flatten_dims(self, start_dim=0, end_dim=-1):
        cur = self._dims()
        end = end_dim % len(cur)
        part = cur[start_dim:end + 1]
        for (s0, c0), (s1, c1) in zip(part, part[1:]):
            if c1 != 1 and c0 != 1 and s0 != s1 * c1:
                raise NotImplementedError("not supported: flattening dims that are not contiguous")
        merged = (part[-1][0], math.prod(c for _, c in part))
        if start_dim == 0 and not self.is_hbm and len(part) > 1:
            raise NotImplementedError("not supported: merging the partition dim of an SBUF/PSUM view")
        return self._with_dims(cur[:start_dim] + [merged] + cur[end + 1:])

    def __repr__(self):
        return f"NkiTensor({self.buffer.name}, shape={self.shape}, dtype={self.dtype})"

    def __len__(self):
        return self._np

    __hash__ = object.__hash__


class IndirectView(NkiTensor):
    """A data tile seen through a free-dim index tile (NkiTensor.indirect)."""

    def __init__(self, data, index, num_elem):
        from tern.nki import language as nl
        tile = nl.ndarray((data.shape[0], num_elem), data.dtype, buffer=sbuf)
        super().__init__(tile._base, tile.buffer, tile.dtype, tile._p0, tile._np, tile._off, tile._free,
                         tile.name, tile._row_stride, tile._alloc)
        self._source = (data, index, num_elem)

    def _tensor(self):
        if self._source is not None:
            from tern.nki import isa
            data, index, n = self._source
            self._source = None
            whole = NkiTensor(self._base, self.buffer, self.dtype, self._p0, self._np, self._off, self._free,
                              self.name, self._row_stride, self._alloc)
            isa.local_gather(dst=whole, src_buffer=data, index=index, num_elem_per_idx=1, num_valid_indices=n)
        return super()._tensor()


def _free_contiguous(free):
    live = [(s, c) for s, c in free if c != 1]
    return all(live[i][0] == live[i + 1][0] * live[i + 1][1] for i in range(len(live) - 1))


def _bounds(k, n, what):
    """(start, count, step, keeps a dim) of index k into a dim of size n."""
    if isinstance(k, ds):
        if k.size < 0 or k.start < 0 or k.start + k.size > n:
            raise IndexError(f"{k} is outside {what} of size {n}")
        return k.start, k.size, 1, True
    if isinstance(k, slice):
        start, stop, step = k.indices(n)
        if step <= 0:
            raise NotImplementedError(f"not supported: a reversed slice {k} of {what}")
        return start, max(0, (stop - start + step - 1) // step), step, True
    if isinstance(k, IndexExpr):
        k = k.offset
    i = int(k)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"index {k} out of range for {what} size {n}")
    return i, 1, 1, False


def row_major(shape):
    """(stride, count) of the dims after the first of a row-major shape."""
    strides, acc = [], 1
    for c in reversed(shape[1:]):
        strides.append(acc)
        acc *= c
    return list(zip(reversed(strides), shape[1:]))


def hbm_tensor(base, buffer, dtype, shape, name):
    """The NkiTensor of a whole row-major HBM allocation."""
    return NkiTensor(base, buffer, dtype, 0, shape[0], 0, row_major(shape), name, math.prod(shape[1:]))
