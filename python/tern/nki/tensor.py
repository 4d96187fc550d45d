"""nki.tensor: host-side constant helpers for nl.shared_constant."""
import numpy as np


def identity(n, dtype="float32"):
    """The n x n identity matrix, with `dtype` as its NKI dtype."""
    from tern.nki._kernel import typed
    return typed(np.eye(int(n), dtype=np.float32), dtype)
