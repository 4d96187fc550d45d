"""tern.graph: build model graphs from Python.

A thin layer over tern._core's graph IR (src/graph): a :class:`Graph` whose
builder methods return :class:`Tensor` handles, with ``+``, ``-``, ``*``,
``@`` and unary ``-`` on handles (a Python number becomes a constant), the
backward pass by :meth:`Graph.backward`, and the float64 reference
interpreter by :meth:`Graph.evaluate`. ``str(g)`` is the graph's text form;
:func:`parse` reads it back. Shapes and dtypes are inferred as nodes are
added; a bad graph raises ``tern._core.TernError`` (a RuntimeError) whose
message names the op and the values, e.g.::

    g = Graph("mlp")
    x = g.input("x", [4, 8])
    w = g.param("w", [8, 16])
    b = g.param("b", [16])
    loss = g.sum(g.gelu(x @ w + b))
    grads = g.backward(loss, [w, b])        # {"w": Tensor, "b": Tensor}
    out = g.evaluate({"x": xv, "w": wv, "b": bv}, [loss, *grads.values()])

The semantics of each op are documented in src/graph/ops.cpp.
"""
import math
import numbers

from tern import _core

__all__ = ["Graph", "Tensor", "parse", "load", "TernError"]

TernError = _core.TernError


class Tensor:
    """A value of a :class:`Graph`: the graph and the value's id."""

    __slots__ = ("graph", "id")

    def __init__(self, graph, id):
        self.graph = graph
        self.id = id

    @property
    def shape(self):
        """The shape, a tuple of ints (outermost first)."""
        return tuple(self.graph.core.shape(self.id))

    @property
    def dtype(self):
        """The dtype's name ("float32", "bfloat16", "int32", ...)."""
        return self.graph.core.dtype(self.id)

    @property
    def name(self):
        """The value's name in the graph (without the '%')."""
        return self.graph.core.value_name(self.id)

    def __repr__(self):
        return f"Tensor(%{self.name}: {list(self.shape)} {self.dtype})"

    def __add__(self, other):
        return self.graph.add(self, other)

    def __radd__(self, other):
        return self.graph.add(other, self)

    def __sub__(self, other):
        return self.graph.sub(self, other)

    def __rsub__(self, other):
        return self.graph.sub(other, self)

    def __mul__(self, other):
        return self.graph.mul(self, other)

    def __rmul__(self, other):
        return self.graph.mul(other, self)

    def __neg__(self):
        return self.graph.scale(self, -1.0)

    def __matmul__(self, other):
        return self.graph.matmul(self, other)


class Graph:
    """A graph under construction; wraps a ``tern._core.Graph`` (``.core``).

    Builder methods take :class:`Tensor` handles of this graph and return
    new ones (``attention`` returns ``(o, lse)``). Dtypes are names: "fp32"
    / "float32", "bf16" / "bfloat16", "int32", ...
    """

    def __init__(self, name="main", core=None):
        self.core = core if core is not None else _core.Graph(name)

    @property
    def name(self):
        return self.core.name

    def __str__(self):
        return _core.print_graph(self.core)

    def __repr__(self):
        return f"<tern.graph.Graph {self.name}: {self.core.num_values()} values>"

    # -- handles --------------------------------------------------------

    def _t(self, id):
        return Tensor(self, id)

    def _id(self, x, like=None):
        """The id of handle x; a number becomes a [] constant of like's dtype."""
        if isinstance(x, Tensor):
            if x.graph is not self:
                raise ValueError(f"{x!r} belongs to graph {x.graph.name}, not to {self.name}")
            return x.id
        if isinstance(x, numbers.Real) and not isinstance(x, bool) and like is not None:
            return self.core.full([], float(x), like.dtype if isinstance(like, Tensor) else like)
        raise TypeError(f"expected a tern.graph.Tensor of graph {self.name}, got {x!r}")

    def _binary(self, fn, a, b):
        like = a if isinstance(a, Tensor) else b
        if not isinstance(like, Tensor):
            raise TypeError(f"expected a tern.graph.Tensor among {a!r} and {b!r}")
        return self._t(fn(self._id(a, like), self._id(b, like)))

    def __getitem__(self, name):
        """The value named `name` (KeyError if absent)."""
        id = self.core.find(name)
        if id < 0:
            raise KeyError(f"graph {self.name} has no value %{name}")
        return self._t(id)

    def __contains__(self, name):
        return self.core.find(name) >= 0

    @property
    def outputs(self):
        """The values marked as outputs, in order."""
        return [self._t(i) for i in self.core.outputs]

    def mark_output(self, *ts):
        """Marks each of `ts` as a result of the graph."""
        for t in ts:
            self.core.mark_output(self._id(t))

    # -- leaves and constants ----------------------------------------------

    def input(self, name, shape, dtype="fp32"):
        """A tensor fed at run time (activations, token ids, targets)."""
        return self._t(self.core.input(name, list(shape), dtype))

    def param(self, name, shape, dtype="fp32"):
        """A trained parameter."""
        return self._t(self.core.param(name, list(shape), dtype))

    def full(self, shape, value, dtype="fp32"):
        """A constant tensor filled with `value`."""
        return self._t(self.core.full(list(shape), float(value), dtype))

    # -- ops ---------------------------------------------------------------

    def matmul(self, a, b, trans_a=False, trans_b=False):
        """a [..., M, K] @ b [K, N] (shared) or [..., K, N] (batched like a);
        trans_a / trans_b: the operand is given transposed."""
        return self._t(self.core.matmul(self._id(a), self._id(b), trans_a, trans_b))

    def add(self, a, b):
        """a + b with NumPy broadcasting."""
        return self._binary(self.core.add, a, b)

    def sub(self, a, b):
        """a - b with NumPy broadcasting."""
        return self._binary(self.core.sub, a, b)

    def mul(self, a, b):
        """a * b with NumPy broadcasting (a number: a scale)."""
        if isinstance(b, numbers.Real) and not isinstance(b, bool):
            return self.scale(a, b)
        if isinstance(a, numbers.Real) and not isinstance(a, bool):
            return self.scale(b, a)
        return self._binary(self.core.mul, a, b)

    def scale(self, x, value):
        """x * value for a number `value`."""
        return self._t(self.core.scale(self._id(x), float(value)))

    def act(self, func, x):
        """An activation by name: gelu, gelu_tanh, silu or relu."""
        return self._t(self.core.act(func, self._id(x)))

    def gelu(self, x):
        return self.act("gelu", x)

    def gelu_tanh(self, x):
        return self.act("gelu_tanh", x)

    def silu(self, x):
        return self.act("silu", x)

    def relu(self, x):
        return self.act("relu", x)

    def rmsnorm(self, x, gamma, eps=1e-6):
        """x * rsqrt(mean(x^2) + eps) * gamma over the last axis."""
        return self._t(self.core.rmsnorm(self._id(x), self._id(gamma), eps))

    def layernorm(self, x, gamma, beta, eps=1e-5):
        """LayerNorm over the last axis."""
        return self._t(self.core.layernorm(self._id(x), self._id(gamma), self._id(beta), eps))

    def softmax(self, x):
        """Softmax over the last axis."""
        return self._t(self.core.softmax(self._id(x)))

    def cross_entropy(self, logits, targets, ignore_index=-100):
        """Mean cross-entropy over the tokens whose target != ignore_index ([], fp32)."""
        return self._t(self.core.cross_entropy(self._id(logits), self._id(targets), ignore_index))

    def embedding(self, table, ids):
        """Rows of table [V, D] for integer ids [...] -> [..., D]."""
        return self._t(self.core.embedding(self._id(table), self._id(ids)))

    def rope(self, x, cos, sin):
        """Rotate-half rotary embedding of x [B, H, S, D] by cos, sin [S, D/2]."""
        return self._t(self.core.rope(self._id(x), self._id(cos), self._id(sin)))

    def attention(self, q, k, v, causal=True, scale=None):
        """softmax(q k^T * scale, masked j > i when causal) v for q [B, Hq, S, D],
        k, v [B, Hkv, Sk, D] (Hq a multiple of Hkv); scale defaults to
        1/sqrt(D). Returns (o [B, Hq, S, D], lse [B, Hq, S] fp32)."""
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        o, lse = self.core.attention(self._id(q), self._id(k), self._id(v), causal, scale)
        return self._t(o), self._t(lse)

    def reshape(self, x, shape):
        """x with a new shape (one entry may be -1)."""
        return self._t(self.core.reshape(self._id(x), list(shape)))

    def transpose(self, x, perm):
        """Output dim i is x's dim perm[i]."""
        return self._t(self.core.transpose(self._id(x), list(perm)))

    def slice(self, x, axis, start, end):
        """x[start:end] along `axis`."""
        return self._t(self.core.slice(self._id(x), axis, start, end))

    def concat(self, xs, axis):
        """The tensors of `xs` joined along `axis`."""
        return self._t(self.core.concat([self._id(x) for x in xs], axis))

    def cast(self, x, dtype):
        """x converted to `dtype` (the reference interpreter does not round)."""
        return self._t(self.core.cast(self._id(x), dtype))

    def sum(self, x, axes=None, keepdims=False):
        """The sum over `axes` (None: all)."""
        return self._t(self.core.sum(self._id(x), list(axes or []), keepdims))

    def broadcast(self, x, shape):
        """x broadcast to `shape` (NumPy rules)."""
        return self._t(self.core.broadcast(self._id(x), list(shape)))

    def op(self, op, *inputs, names=None, **attrs):
        """A node of any op by name, with attributes as keywords; returns a
        Tensor, or a tuple of them for ops with several outputs."""
        ids = self.core.add_op(op, [self._id(x) for x in inputs], attrs, list(names or []))
        ts = tuple(self._t(i) for i in ids)
        return ts[0] if len(ts) == 1 else ts

    # -- autodiff and evaluation -------------------------------------------

    def backward(self, loss, wrt):
        """Adds the gradient of the scalar `loss` with respect to each of
        `wrt`; returns {value name: gradient Tensor} (named "grad.<name>")."""
        grads = _core.add_backward(self.core, self._id(loss), [self._id(t) for t in wrt])
        return {self.core.value_name(v): self._t(d) for v, d in grads.items()}

    def evaluate(self, feeds, values=None):
        """Runs the float64 reference interpreter.

        feeds: {input or param (name or Tensor): array-like shaped like it}.
        values: Tensors or names to return (default: the graph's outputs).
        Returns {value name: float64 ndarray}.
        """
        fd = {(k.name if isinstance(k, Tensor) else k): v for k, v in feeds.items()}
        if values is None:
            ts = self.outputs
        else:
            ts = [self[v] if isinstance(v, str) else v for v in values]
        arrays = _core.evaluate(self.core, fd, [self._id(t) for t in ts])
        return {t.name: a for t, a in zip(ts, arrays)}

    def save(self, path):
        """Writes the text form to `path` (atomically)."""
        _core.save_graph(self.core, path)

    # -- precision and the optimizer ----------------------------------------

    def autocast(self, mode, type="bf16", mx_policy="rceil", fp8_scaling="current",
                 amax_history=1024):
        """A new Graph: this forward graph under an autocast mode ("none",
        "matmult", "all" with `type` bf16 / fp16 / fp8_e4m3) or a precision
        recipe ("bf16", "fp8-hybrid", "mxfp8", "mxfp4"; MX scales by
        `mx_policy`: rceil, trn3, ocp-floor; per-tensor FP8 by `fp8_scaling`:
        current or delayed over `amax_history` steps). Values keep their
        names."""
        return Graph(core=_core.autocast(self.core, mode, type, mx_policy, fp8_scaling,
                                         amax_history))

    def adamw(self, grads, beta1=0.9, beta2=0.999, eps=1e-8):
        """Adds the AdamW step for every param of `grads` ({param name:
        gradient Tensor}, as ``backward`` returns): FP32 masters and moments
        as inputs, their updates carried into them after each step. Returns
        what to write before the first step: {"scalars": name, "master":
        {master: param it starts from}, "zeros": [moment names]}."""
        ids = {self._id(self[p]): self._id(d) for p, d in grads.items()}
        return _core.add_adamw(self.core, ids, beta1, beta2, eps)

    # -- compilation and the device -----------------------------------------

    def compile(self, chip="trn3", cores=0, lnc=1):
        """Fuses, plans HBM and lowers to kernel launches for `chip` (a name
        or a ``_core.load_chip`` result); returns a Compiled program.
        Compiling the same graph, chip and options again reuses the
        executable (a process-wide cache)."""
        spec = _core.load_chip(chip) if isinstance(chip, str) else chip
        return Compiled(self, _core.compile_graph(self.core, spec, cores, False, lnc), spec)


class Compiled:
    """A compiled graph and a simulated device to run it on, step after
    step: ``outputs, ns = c.run(feeds)``."""

    def __init__(self, graph, executable, chip):
        self.graph, self.executable, self.chip = graph, executable, chip
        self.device = _core.Device(chip)

    def run(self, feeds):
        """feeds: {input or param (name or Tensor): array-like}. Returns
        ({output name: float32 ndarray}, simulated nanoseconds)."""
        fd = {(k.name if isinstance(k, Tensor) else k): v for k, v in feeds.items()}
        return self.device.run(self.executable, fd)

    def session(self):
        """A Session: the program loaded on a fresh simulated device whose
        memory persists across steps (weights and optimizer state stay on
        the device; carries apply after each step)."""
        return Session(_core.Session(self.chip, self.executable))


class Session:
    """A compiled program on a device, step after step: ``write`` inputs
    and params once, then ``outputs, ns, events = s.step({batch feeds})``."""

    def __init__(self, core):
        self.core = core

    def write(self, name, values):
        """Host -> device: an input or param (name or Tensor)."""
        self.core.write(name.name if isinstance(name, Tensor) else name, values)

    def fill(self, name, value):
        self.core.fill(name.name if isinstance(name, Tensor) else name, float(value))

    def read(self, name):
        """Device -> host: an input, param or graph output (float32 ndarray)."""
        return self.core.read(name.name if isinstance(name, Tensor) else name)

    def step(self, feeds=None):
        """Writes `feeds`, runs one step and applies the carries. Returns
        ({output name: ndarray}, simulated ns, [launch events: dicts with
        group, kernel, detail, start_ns, ns])."""
        fd = {(k.name if isinstance(k, Tensor) else k): v for k, v in (feeds or {}).items()}
        return self.core.step(fd)

    @property
    def steps(self):
        return self.core.steps


def adamw_scalars(lr, weight_decay=0.01, beta1=0.9, beta2=0.999, step=1):
    """The "adamw.scalars" feed of step `step` (from 1)."""
    return _core.adamw_scalars(lr, weight_decay, beta1, beta2, step)


def parse(text, source="<text>"):
    """A Graph from its text form; errors read '<source>:<line>: ...'."""
    return Graph(core=_core.parse_graph(text, source))


def load(path):
    """A Graph from a .tgraph file."""
    return Graph(core=_core.load_graph(path))
