"""tern: a Trainium3-class training system in software.

The C++ layers live in tern._core (hardware descriptions, the kernel
builder, the simulator, the graph IR); tern.nki runs NKI kernels written in
Python on the simulated chip, with time; tern.graph builds model graphs
(autodiff, a float64 reference interpreter, the text form).
"""
from tern import _core  # noqa: F401

__all__ = ["nki", "graph"]
