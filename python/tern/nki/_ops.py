"""The operators and functions of nki.language: each is a value passed to
nki.isa calls (op=nl.add, op=nl.exp) and a tile function (nl.add(a, b),
nl.exp(x), nl.max(x, axis=1)). Numpy functions kernels pass in their
place (np.add, np.max, np.exp ...) resolve to the same operators."""
from tern.nki import _tensor as T


class Op:
    """An ALU operator (alu: tern's name), an activation function (act), a
    reduction (reduce: its ALU operator) or several at once."""

    def __init__(self, name, alu=None, act=None, kind="binary", reduce_alu=None):
        self.name, self.alu, self.act, self.kind = name, alu, act, kind
        self.reduce_alu = reduce_alu or alu

    def __call__(self, *args, **kwargs):
        from tern.nki import _functions as F
        if self.kind == "reduce":
            x = args[0] if args else kwargs.pop("x")
            axis = args[1] if len(args) > 1 else kwargs.pop("axis", None)
            return F.reduce(self, x, axis, **kwargs)
        if self.kind == "unary":
            x = args[0] if args else kwargs.pop("x")
            return F.unary(self, x, **kwargs)
        a = args[0] if args else kwargs.pop("x")
        b = args[1] if len(args) > 1 else kwargs.pop("y")
        kwargs.pop("max_free_vec_size", None)  # a compiler hint
        return F.binary(self, a, b, **kwargs)

    def __repr__(self):
        return f"nl.{self.name}"


def _binary(name, alu):
    return Op(name, alu=alu)


def _act(name, act):
    return Op(name, act=act, kind="unary")


BINARY = {n: _binary(n, a) for n, a in (
    ("add", "add"), ("subtract", "subtract"), ("multiply", "multiply"), ("divide", "divide"),
    ("maximum", "max"), ("minimum", "min"), ("equal", "is_equal"), ("not_equal", "not_equal"),
    ("greater", "is_gt"), ("greater_equal", "is_ge"), ("less", "is_lt"), ("less_equal", "is_le"),
    ("power", "pow"), ("bitwise_and", "bitwise_and"), ("bitwise_or", "bitwise_or"),
    ("bitwise_xor", "bitwise_xor"), ("left_shift", "shift_left"), ("right_shift", "shift_right"),
    ("abs_max", "abs_max"), ("bypass", "bypass"),  # bypass: the first operand (no operation)
    # Booleans as 0 / 1: and = product, or = max, xor = not_equal.
    ("logical_and", "multiply"), ("logical_or", "max"), ("logical_xor", "not_equal"))}

ACTIVATIONS = {n: _act(n, a) for n, a in (
    ("exp", "exp"), ("log", "log"), ("tanh", "tanh"), ("sigmoid", "sigmoid"), ("gelu", "gelu"),
    ("gelu_apprx_tanh", "gelu_tanh"), ("gelu_apprx_sigmoid", "gelu_sigmoid"), ("gelu_dx", "gelu_dx"),
    ("gelu_apprx_tanh_dx", "gelu_tanh_dx"), ("gelu_apprx_sigmoid_dx", "gelu_sigmoid_dx"),
    ("silu", "silu"), ("silu_dx", "silu_dx"), ("relu", "relu"), ("sqrt", "sqrt"),
    ("square", "square"), ("reciprocal", "reciprocal"), ("copy", "identity"), ("identity", "identity"),
    ("sin", "sin"), ("cos", "cos"), ("arctan", "arctan"), ("erf", "erf"), ("erf_dx", "erf_dx"),
    ("softplus", "softplus"), ("mish", "mish"), ("sign", "sign"))}

# ALU-only unaries (Vector engine): abs = abs_max(x, 0); negative = x * -1;
# invert = x xor all-ones. abs also has an activation-table entry.
UNARY = {"abs": Op("abs", alu="abs_max", act="abs", kind="unary"),
         # rsqrt: an activation function and an ALU operator (1 / sqrt(a); b unused).
         "rsqrt": Op("rsqrt", alu="rsqrt", act="rsqrt", kind="unary"),
         "negative": Op("negative", kind="unary"),
         "invert": Op("invert", kind="unary"),
         "bitwise_not": Op("invert", kind="unary"),
         "logical_not": Op("logical_not", alu="is_equal", kind="unary")}

REDUCE = {"max": Op("max", alu="max", kind="reduce"), "min": Op("min", alu="min", kind="reduce"),
          "sum": Op("sum", alu="add", kind="reduce"), "prod": Op("prod", alu="multiply", kind="reduce"),
          "all": Op("all", alu="min", kind="reduce"), "any": Op("any", alu="max", kind="reduce")}

ALL = {**BINARY, **ACTIVATIONS, **UNARY, **REDUCE}

# The operator a reduction stands for as an ALU op value (op=nl.max).
for _r in REDUCE.values():
    _r.reduce_alu = _r.alu


def _numpy_table():
    import numpy as np
    names = {
        "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
        "true_divide": "divide", "maximum": "maximum", "minimum": "minimum", "equal": "equal",
        "not_equal": "not_equal", "greater": "greater", "greater_equal": "greater_equal", "less": "less",
        "less_equal": "less_equal", "power": "power", "bitwise_and": "bitwise_and",
        "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor", "left_shift": "left_shift",
        "right_shift": "right_shift", "logical_and": "logical_and", "logical_or": "logical_or",
        "logical_xor": "logical_xor", "exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt",
        "square": "square", "reciprocal": "reciprocal", "copy": "copy", "sin": "sin", "cos": "cos",
        "arctan": "arctan", "sign": "sign", "abs": "abs", "absolute": "abs", "negative": "negative",
        "invert": "invert", "max": "max", "amax": "max", "min": "min", "amin": "min", "sum": "sum",
        "prod": "prod", "logical_not": "logical_not"}
    table = {}
    for np_name, nl_name in names.items():
        f = getattr(np, np_name, None)
        if f is not None:
            table[id(f)] = ALL[nl_name]
    return table


_NUMPY = None


def resolve(op):
    """The Op for an nl operator or a numpy function standing for one."""
    global _NUMPY
    if isinstance(op, Op) or op is None:
        return op
    if _NUMPY is None:
        _NUMPY = _numpy_table()
    got = _NUMPY.get(id(op))
    if got is None:
        raise ValueError(f"{op!r} is not an NKI operator (nl.add, nl.exp, np.add, ...)")
    return got


def is_tile(x):
    return isinstance(x, T.NkiTensor)
