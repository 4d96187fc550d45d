"""The enums of nki.isa (also importable as nki.isa.constants): engines,
reduce commands, DGE and out-of-bounds modes, NeuronCore generations and
matmul performance modes, with NKI's values."""
import enum


class engine(enum.IntEnum):
    """The engine an instruction runs on (engine= of nki.isa calls)."""
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):
    """What an instruction does with its engine's reduce registers."""
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.IntEnum):
    """How DMA descriptors are generated. tern times hwdge as the hardware
    DGE's time before the transfer, the others as descriptors built before
    the run (docs/nki.md)."""
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):
    """An indirect DMA index out of range: stop with an error, or skip it."""
    error = 0
    skip = 1


class nc_version(enum.IntEnum):
    """NeuronCore generations: gen2 Trainium1, gen3 Trainium2, gen4 Trainium3."""
    gen2 = 2
    gen3 = 3
    gen4 = 4


class matmul_perf_mode(str, enum.Enum):
    """Tensor engine modes: double_row packs two FP8 contraction rows per PE."""
    none = "none"
    double_row = "double_row"
    double_row_gen3 = "double_row_gen3"


class fp32:
    """FP32 constants: fp32.min is the most negative finite value."""
    min = -3.4028234663852886e38
    max = 3.4028234663852886e38
