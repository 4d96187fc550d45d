"""neuronxcc.nki.language.constants: dtype sizes for kernels that compute
byte counts while tracing."""
from tern import _core


def sizeinbytes(dtype):
    """Bytes per element of an NKI dtype (x4 types: per packed group)."""
    from tern.nki.language import _dtype_name
    return _core.dtype_size(_dtype_name(dtype))
