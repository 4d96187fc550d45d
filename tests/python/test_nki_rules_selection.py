"""The hardware rules of the selection / search / scan and multi-core calls
name the rule and the kernel line; PSUM packing, zero-step iota and the
dropout rates tern can compute."""
import inspect

import numpy as np
import pytest

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


def line_of(fn, needle):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, t in enumerate(lines) if needle in t)


def too_few_for_max8(x):
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    d = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    nisa.max8(dst=d, src=t)  # 4 elements: max8 needs 8..16384
    return out


def float_indices(x):
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    v = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    d = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    nisa.memset(dst=v, value=1.0)
    nisa.nc_find_index8(dst=d, data=t, vals=v)  # indices must be uint16 / uint32
    return out


def bad_shuffle(x):
    out = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=[40] * 32)  # 40 is no partition of a quadrant
    return out


def range_select_on_trn1(x):
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    nisa.memset(dst=b, value=2.0)
    nisa.range_select(dst=t, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b, bound1=b)
    return out


@pytest.mark.parametrize("fn,target,rule,needle", [
    (too_few_for_max8, "trn3", "needs 8..16384", "nisa.max8("),
    (float_indices, "trn2", "uint16 or uint32", "nisa.nc_find_index8("),
    (bad_shuffle, "trn3", "neither a partition 0..31 nor 255", "nisa.nc_stream_shuffle("),
    (range_select_on_trn1, "trn1", "NeuronCore-v3", "nisa.range_select("),
])
def test_rule_violations_name_the_rule_and_the_line(fn, target, rule, needle):
    with pytest.raises(nki.TernError) as err:
        nki.jit(fn, platform_target=target)(np.zeros((128, 4), dtype=np.float32))
    assert rule in str(err.value)
    assert f"test_nki_rules_selection.py:{line_of(fn, needle)}" in str(err.value)


def unmatched_barrier(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:  # only program 0 reaches the barrier
        nisa.core_barrier(out, (0, 1))
    return out


def test_a_barrier_one_core_never_reaches_is_an_error_not_a_hang():
    with pytest.raises(nki.TernError, match="never reaches"):
        nki.jit(unmatched_barrier, platform_target="trn2")[2](np.zeros((128, 4), dtype=np.float32))


@nki.jit
def nine_transposes(a):
    """Nine live [128, 128] FP32 PSUM tiles (512 bytes a partition each):
    they fit 16 KiB of PSUM only when tiles share banks."""
    out = nl.ndarray((128, 9 * 128), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    tiles = []
    for k in range(9):
        p = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=x)
        tiles.append(p)
    for k, p in enumerate(tiles):
        s = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        nisa.dma_copy(dst=out[:, k * 128:(k + 1) * 128], src=s)
    return out


def test_small_psum_tiles_share_banks():
    a = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    got = nine_transposes(a)
    assert np.array_equal(got, np.tile(a.T, (1, 9)))


@nki.jit
def repeated_iota(x):
    """A zero step repeats values: dst[p, j, i] = 10 + 3 * p + 2 * i."""
    out = nl.ndarray((128, 4, 8), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 4, 8), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=[[0, 4], [2, 8]], offset=10, channel_multiplier=3)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_iota_with_a_zero_step():
    got = repeated_iota(np.zeros(1, dtype=np.float32))
    p, j, i = np.meshgrid(np.arange(128), np.arange(4), np.arange(8), indexing="ij")
    assert np.array_equal(got, 10 + 3 * p + 2 * i + 0 * j)


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_dropout_at_rates_zero_and_one(rate):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dropout(dst=d, data=t, prob=rate)
        nisa.dma_copy(dst=out, src=d)
        return out

    a = np.linspace(-1, 1, 128 * 16, dtype=np.float32).reshape(128, 16)
    assert np.array_equal(k(a), a * (1.0 - rate))


def test_integer_immediates_beyond_float32_on_float_data_say_not_supported():
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=0x12345679)

    with pytest.raises(NotImplementedError, match="beyond float32's exact range on float32"):
        k(np.zeros((128, 4), dtype=np.float32))


def test_integer_immediates_beyond_float32_are_exact_on_32_bit_integers():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.bitwise_xor, operand0=0x12345679, op1=nl.bitwise_and,
                           operand1=0xFFFFFFFE)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.random.default_rng(2).integers(0, 2**32, size=(128, 8), dtype=np.uint32)
    assert np.array_equal(k(a), (a ^ 0x12345679) & 0xFFFFFFFE)


@nki.jit
def scratch_per_program(a):
    """Each program of kernel[2] writes its own value to a private_hbm
    scratch, then reads it back: with one shared scratch the programs
    would see each other's."""
    out = nl.ndarray((2, 128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    scratch = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.private_hbm)
    t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=float(pid + 1))
    nisa.dma_copy(dst=scratch, src=t)
    u = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=scratch)
    nisa.dma_copy(dst=out[pid], src=u)
    return out


def test_private_hbm_is_each_programs_own():
    got = nki.jit(scratch_per_program.fn, platform_target="trn2")[2](np.zeros(1, dtype=np.float32))
    assert np.array_equal(got[0], np.full((128, 4), 1.0)) and np.array_equal(got[1], np.full((128, 4), 2.0))


def mx_matmul(a, b, quadrant_scales):
    """a [128, 512] bf16 (K on partitions), b [128, 512]: both quantized to
    MXFP8 on chip, then multiplied; scales [16, 128] packed, or [128, 128]
    in NKI's quadrant layout (rows 0:4, 32:36, 64:68, 96:100)."""
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    srows = 128 if quadrant_scales else 16
    qs = []
    for x in (a, b):
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        q = nl.ndarray((128, 128), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        s = nl.ndarray((srows, 128), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=t, dst_scale=s)
        qs.append((q, s))
    p = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=p, stationary=qs[0][0], moving=qs[1][0], stationary_scale=qs[0][1],
                      moving_scale=qs[1][1])
    r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=p)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_mx_scales_in_the_quadrant_layout_give_the_same_bits():
    rng = np.random.default_rng(9)
    a = nki.typed(rng.standard_normal((128, 512)).astype(np.float32), nl.bfloat16)
    b = nki.typed(rng.standard_normal((128, 512)).astype(np.float32), nl.bfloat16)
    packed = nki.jit(mx_matmul, platform_target="trn3")(a, b, False)
    quadrant = nki.jit(mx_matmul, platform_target="trn3")(a, b, True)
    assert np.array_equal(packed, quadrant)
    assert np.abs(packed).max() > 0


@nki.jit
def aliased_psum(a):
    """Two PSUM tiles placed at the same address (address=): the second
    sees what the first wrote, as on the hardware."""
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    big = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
    nisa.nc_transpose(dst=big, data=x)
    view = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum, address=(0, 2048 + 64 * 4))
    s = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=view)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_placed_tiles_alias_where_the_kernel_puts_them():
    a = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    assert np.array_equal(aliased_psum(a), a.T[:, 64:])


def test_a_placement_outside_the_memory_is_an_error():
    @nki.jit
    def k(a):
        nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum, address=(0, 14336))

    with pytest.raises(nki.TernError, match="outside"):
        k(np.zeros(1, dtype=np.float32))


@nki.jit
def bytes_as_words(a):
    """A uint8 [128, 16] tile seen as uint32 [128, 4] (.view rescales the
    innermost dim), copied out."""
    out = nl.ndarray((128, 4), dtype=nl.uint32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    w = nl.ndarray((128, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=w, src=t.view(nl.uint32))
    nisa.dma_copy(dst=out, src=w)
    return out


def test_view_as_a_wider_type_rescales_the_innermost_dim():
    a = np.random.default_rng(4).integers(0, 256, size=(128, 16), dtype=np.uint8)
    assert np.array_equal(bytes_as_words(a), a.view(np.uint32))


def mx_matmul_shared_scales(a, b):
    """As mx_matmul, both operands' scales in one [128, 128] tile: the
    stationary's at rows 0:4 of each quadrant, the moving's at rows 4:8
    (a view from partition 4)."""
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    scales = nl.ndarray((128, 128), dtype=nl.uint8, buffer=nl.sbuf)
    qs = []
    for x, s in ((a, scales), (b, scales[4:128])):
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        q = nl.ndarray((128, 128), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=t, dst_scale=s)
        qs.append((q, s))
    p = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=p, stationary=qs[0][0], moving=qs[1][0], stationary_scale=qs[0][1],
                      moving_scale=qs[1][1])
    r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=p)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_mx_scales_of_two_operands_in_one_tile():
    rng = np.random.default_rng(10)
    a = nki.typed(rng.standard_normal((128, 512)).astype(np.float32), nl.bfloat16)
    b = nki.typed(rng.standard_normal((128, 512)).astype(np.float32), nl.bfloat16)
    want = nki.jit(mx_matmul, platform_target="trn3")(a, b, False)
    assert np.array_equal(nki.jit(mx_matmul_shared_scales, platform_target="trn3")(a, b), want)
