"""Kernel inputs in and outputs out, exactly: numpy arrays, torch CPU
tensors and numpy arrays of ml_dtypes' types (when a caller has them) become
HBM tensors of the matching NKI dtype by their raw bytes, so integers of any
size and BF16 / FP8 codes arrive bit for bit; outputs come back in the
kernel's dtype."""
import numpy as np

from tern import _core

try:  # optional: a caller's torch tensors (Debian's python3-torch)
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency
    torch = None

_NUMPY = {
    "float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8,
    "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
    "int64": None, "uint64": None, "bool": np.uint8,
}
# Types numpy lacks: their raw codes (the storage integer of the same size).
_BITS = {
    "bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8,
    "float8_e4m3": np.uint8, "float8_e8m0fnu": np.uint8, "tfloat32": np.uint32,
    "float8_e4m3fn_x4": np.uint32, "float8_e5m2_x4": np.uint32, "float4_e2m1fn_x4": np.uint16,
}
# ml_dtypes' numpy names -> NKI names (ml_dtypes "float8_e4m3" is IEEE-like, as NKI's).
_ML_DTYPES = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
              "float8_e4m3": "float8_e4m3", "float8_e8m0fnu": "float8_e8m0fnu"}


def _torch_dtypes():
    if torch is None:
        return {}
    names = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int8": "int8",
             "uint8": "uint8", "int16": "int16", "int32": "int32", "bool": "uint8",
             "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
             "uint16": "uint16", "uint32": "uint32", "float64": "float32"}
    return {getattr(torch, t): n for t, n in names.items() if hasattr(torch, t)}


_TORCH = _torch_dtypes()


class Bits(np.ndarray):
    """An array of a type numpy lacks (bfloat16, the FP8 types, the x4
    packed types): the raw codes as unsigned integers, with `nki_dtype`
    naming the type. Outputs of those types come back as Bits (from numpy
    inputs); `nki.Bits(codes, nl.float8_e5m2)` passes codes in exactly;
    `tern.nki.to_float32(bits)` decodes the values."""

    def __new__(cls, codes, dtype):
        obj = np.asarray(codes).view(cls)
        obj.nki_dtype = dtype
        return obj

    def __array_finalize__(self, obj):
        self.nki_dtype = getattr(obj, "nki_dtype", None)


def is_torch(a):
    return torch is not None and isinstance(a, torch.Tensor)


def is_array(a):
    """Whether an argument is a tensor the kernel gets in HBM."""
    return isinstance(a, np.ndarray) or is_torch(a)


def natural_dtype(a):
    """The NKI dtype an input array carries."""
    explicit = getattr(a, "nki_dtype", None)
    if explicit:
        return explicit
    if is_torch(a):
        try:
            return _TORCH[a.dtype]
        except KeyError:
            raise TypeError(f"no NKI dtype for torch {a.dtype}") from None
    name = a.dtype.name
    if name in _ML_DTYPES:
        return _ML_DTYPES[name]
    if name == "float64":
        return "float32"
    if _NUMPY.get(name) is None:
        raise TypeError(f"no NKI dtype for numpy {a.dtype}; pass a supported dtype (see docs/nki.md)")
    return "uint8" if name == "bool" else name


def _raw_numpy(a):
    """(values as numpy, whether they are already raw codes of the NKI type)."""
    if is_torch(a):
        t = a.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), True
        if t.dtype in _TORCH and t.dtype.is_floating_point and t.element_size() == 1:
            return t.view(torch.uint8).numpy(), True
        if t.dtype == torch.bool:
            return t.to(torch.uint8).numpy(), True
        return t.numpy(), False
    if a.dtype.name in _ML_DTYPES:
        return np.ascontiguousarray(a).view(_BITS[_ML_DTYPES[a.dtype.name]]), True
    if isinstance(a, Bits):  # raw codes of a type numpy lacks, passed back in
        return np.asarray(a), True
    return np.asarray(a), False


def encode(a, dtype):
    """The bytes of HBM tensor `dtype` holding input a: exact when a holds
    that type already (integers of any size, codes), else its values
    rounded to nearest even."""
    values, is_codes = _raw_numpy(a)
    if is_codes or (values.dtype.name == dtype):
        return np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    if values.dtype == np.bool_:
        values = values.astype(np.uint8)
    np_type = _NUMPY.get(dtype)
    if np_type is not None and dtype not in ("float32", "float16"):
        return np.ascontiguousarray(values.astype(np_type)).reshape(-1).view(np.uint8)
    if dtype in ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4"):
        return np.ascontiguousarray(values.astype(_BITS[dtype])).reshape(-1).view(np.uint8)
    return _core.encode(dtype, np.ascontiguousarray(values, dtype=np.float32).reshape(-1))


def decode(raw, dtype, shape, as_torch):
    """An output's bytes as an array of its dtype: numpy types as numpy (or
    torch when torch tensors went in); bfloat16 / FP8 as torch tensors of
    that type when torch has it and torch tensors went in, else as Bits."""
    raw = np.asarray(raw, dtype=np.uint8)
    np_type = _NUMPY.get(dtype)
    if np_type is not None:
        arr = raw.view(np_type).reshape(shape)
        if as_torch and arr.dtype.kind == "u" and arr.dtype.itemsize > 1 and \
                getattr(torch, f"uint{8 * arr.dtype.itemsize}", None) is None:
            return arr  # this torch has no such unsigned type: the exact values as numpy
        return torch.from_numpy(arr.copy()) if as_torch else arr
    codes = raw.view(_BITS[dtype]).reshape(shape)
    if as_torch:
        if dtype == "bfloat16":
            return torch.from_numpy(codes.view(np.int16).copy()).view(torch.bfloat16)
        t = getattr(torch, dtype, None)
        if t is not None and dtype.startswith("float8"):
            return torch.from_numpy(codes.copy()).view(t)
    return Bits(codes.copy(), dtype)


def to_float32(x, dtype=None):
    """The FP32 values of an array of raw codes (a Bits output, or codes with
    `dtype` named), of a torch tensor, or of any numpy array."""
    if is_torch(x):
        return x.detach().cpu().float().numpy()
    dtype = dtype or getattr(x, "nki_dtype", None)
    x = np.asarray(x)
    if dtype is None or dtype in _NUMPY:
        return x.astype(np.float32)
    return _core.decode(dtype, np.ascontiguousarray(x).reshape(-1).view(np.uint8)).reshape(x.shape)


def write_back(dst, raw, dtype):
    """Copies a kernel's result (raw bytes of `dtype`) into the caller's
    array in place: an output passed in as an argument."""
    value = decode(raw, dtype, tuple(dst.shape), is_torch(dst))
    if is_torch(dst):
        with torch.no_grad():
            dst.copy_(value if is_torch(value) else torch.from_numpy(to_float32(value)))
        return
    if isinstance(value, Bits):
        if dst.dtype.name in _ML_DTYPES:
            dst.view(value.dtype)[...] = np.asarray(value)
        else:
            dst[...] = to_float32(value)
        return
    dst[...] = value
