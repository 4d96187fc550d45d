"""neuronxcc.nki for tern: the legacy NKI generation (SDK 2.20-2.26). Its
nki.language is tern.nki.language (it holds both generations' names), its
nki.isa is tern.nki.legacy_isa (instructions return new tiles), and the
entry points are tern.nki's."""
import types

from tern import nki as _nki
from tern.nki import compiler, isa_enums, language, language_constants, legacy_isa, typing

isa = legacy_isa
jit, baremetal, benchmark, profile = _nki.jit, _nki.baremetal, _nki.benchmark, _nki.profile
simulate_kernel, simulate = _nki.simulate_kernel, _nki.simulate
TernError = _nki.TernError


def modules():
    """sys.modules entries for the legacy import paths."""
    import sys
    me = sys.modules[__name__]
    pkg = types.ModuleType("neuronxcc")
    pkg.__path__ = []
    pkg.nki = me
    return {"neuronxcc": pkg, "neuronxcc.nki": me, "neuronxcc.nki.language": language,
            "neuronxcc.nki.isa": legacy_isa, "neuronxcc.nki.isa.constants": isa_enums,
            "neuronxcc.nki.typing": typing, "neuronxcc.nki.compiler": compiler,
            "neuronxcc.nki.language.constants": language_constants}
