"""Kernel inputs and outputs keep their bits: every NKI dtype round-trips
through HBM and SBUF (DMA in, DMA out) exactly, from numpy arrays and torch
tensors, integers over their full range included."""
import numpy as np
import pytest
import torch

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def round_trip(x):
    """HBM -> SBUF -> HBM, the same dtype throughout (raw bytes)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def int_extremes(dtype, shape=(128, 64)):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    x = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    x.flat[:4] = [info.min, info.max, 0, info.max - 1]
    return x


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32])
@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_integers_round_trip_over_their_full_range(dtype, target):
    x = int_extremes(dtype)
    got = nki.jit(round_trip.fn, platform_target=target)(x)
    assert got.dtype == dtype
    assert np.array_equal(got, x)


def test_uint32_above_2_to_the_24_is_exact():
    x = np.full((128, 4), 0x12345679, dtype=np.uint32)
    x[0, 0] = 0xFFFFFFFF
    got = round_trip(x)
    assert got[1, 1] == 0x12345679 and got[0, 0] == 0xFFFFFFFF


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numpy_floats_keep_every_bit_pattern(dtype):
    bits = np.uint32 if dtype == np.float32 else np.uint16
    rng = np.random.default_rng(3)
    raw = rng.integers(0, np.iinfo(bits).max, size=(128, 32), dtype=bits, endpoint=True)
    # Every finite and infinite pattern; NaNs keep their payload through a copy too.
    x = raw.view(dtype)
    got = round_trip(x)
    assert got.dtype == dtype
    assert np.array_equal(got.view(bits), raw)


def test_bfloat16_all_65536_codes_through_torch():
    codes = np.arange(65536, dtype=np.uint16).reshape(128, 512)
    x = torch.from_numpy(codes.view(np.int16).copy()).view(torch.bfloat16)
    got = round_trip(x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), codes)


def test_bfloat16_output_from_numpy_is_bits_with_a_decoder():
    x = nki.typed(np.array([[1.0, -2.5, 3.140625, 65280.0]] * 128, dtype=np.float32), nl.bfloat16)
    got = round_trip(x)
    assert isinstance(got, nki.Bits) and got.nki_dtype == "bfloat16" and got.dtype == np.uint16
    assert got[0, 0] == 0x3F80 and got[0, 1] == 0xC020
    assert np.array_equal(nki.to_float32(got), np.asarray(x))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_all_256_codes_round_trip(dtype):
    codes = np.tile(np.arange(256, dtype=np.uint8), (128, 1))
    tdt = getattr(torch, dtype, None)
    if tdt is not None:  # torch with float8 types
        got = round_trip(torch.from_numpy(codes.copy()).view(tdt))
        assert np.array_equal(got.view(torch.uint8).numpy(), codes)
        return
    got = nki.jit(round_trip.fn, platform_target="trn3")(nki.Bits(codes, dtype))
    assert isinstance(got, nki.Bits) and got.nki_dtype == dtype
    assert np.array_equal(np.asarray(got), codes)


def test_fp8_values_saturate_on_the_way_in():
    """Values (not codes) are rounded to nearest even and, as the engines'
    FP8 outputs, saturate: -inf becomes the most negative finite E5M2."""
    x = nki.typed(np.array([[np.inf, -np.inf, 1.0, 0.3]] * 128, dtype=np.float32), nl.float8_e5m2)
    got = np.asarray(nki.jit(round_trip.fn, platform_target="trn3")(x))
    assert list(got[0]) == [0x7B, 0xFB, 0x3C, 0x35]


def test_torch_inputs_give_torch_outputs_of_the_same_dtype():
    for t in (torch.float32, torch.float16, torch.int32, torch.int16, torch.int8, torch.uint8):
        x = (torch.arange(128 * 8) % 100 - 50).reshape(128, 8).to(t)
        got = round_trip(x)
        assert isinstance(got, torch.Tensor) and got.dtype == t
        assert torch.equal(got, x)


def test_torch_int32_full_range():
    x = torch.from_numpy(int_extremes(np.int32))
    assert torch.equal(round_trip(x), x)


@nki.jit
def to_uint32(x):
    """An int32 input copied out as uint32 (router_topk's expert indices)."""
    out = nl.ndarray(x.shape, dtype=nl.uint32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=nl.load(x))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_uint32_output_with_torch_inputs_is_exact():
    """torch has no uint32 (1.13): the output stays an exact numpy uint32 array."""
    x = torch.arange(128 * 4, dtype=torch.int32).reshape(128, 4) * 7
    got = to_uint32(x)
    if getattr(torch, "uint32", None) is None:
        assert isinstance(got, np.ndarray) and got.dtype == np.uint32
    assert np.array_equal(np.asarray(got), x.numpy().astype(np.uint32))


@nki.jit
def widen(x):
    """int32 -> float32 on the Vector engine: exact up to 2^24."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    f = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_copy(dst=f, src=t)
    nisa.dma_copy(dst=out, src=f)
    return out


def test_int_to_float_copy_is_the_exact_value():
    x = (np.arange(128 * 16, dtype=np.int32).reshape(128, 16) - 1000) * 4097
    got = widen(x)
    assert got.dtype == np.float32
    assert np.array_equal(got, x.astype(np.float32))


def test_bool_inputs_are_uint8():
    x = np.zeros((128, 8), dtype=bool)
    x[::3] = True
    got = round_trip(x)
    assert got.dtype == np.uint8 and np.array_equal(got, x.astype(np.uint8))


def test_float64_inputs_become_float32_values():
    x = np.linspace(-3, 3, 128 * 4).reshape(128, 4)
    got = round_trip(x)
    assert got.dtype == np.float32 and np.array_equal(got, x.astype(np.float32))


def test_an_unsupported_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="complex128"):
        round_trip(np.zeros((128, 4), dtype=np.complex128))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3", "bfloat16", "float16"])
def test_codecs_match_torch_where_torch_has_the_type(dtype):
    """_core.encode / decode (the simulator's codec) against torch's casts."""
    from tern import _core
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype) or getattr(torch, dtype, None)
    if tdt is None:
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    vals = np.random.default_rng(5).standard_normal(4096).astype(np.float32) * 8
    ours = _core.encode(dtype, vals)
    theirs = torch.from_numpy(vals).to(tdt)
    size = theirs.element_size()
    ref = theirs.view(torch.int16 if size == 2 else torch.uint8).numpy().view(np.uint8)
    assert np.array_equal(ours, ref)
