"""tern.nki behaviours: targets, hardware-rule errors pointing at the kernel
line, unsupported calls, `import nki`, timing-only benchmarks."""
import sys

import numpy as np
import pytest

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


def line_of(fn, needle):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if needle in text:
            return first + i
    raise AssertionError(needle)


@nki.jit
def sbuf_overflow(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    big = nl.ndarray((128, 80000), dtype=nl.float32, buffer=nl.sbuf)  # 320 KB per partition
    nisa.memset(dst=big, value=0.0)
    return out


@nki.jit
def psum_bank_crossing(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc[:, 256:768], value=0.0)  # bytes 1024..3072 cross the 2 KiB bank
    return out


@nki.jit
def bad_partition_start(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t[16:80, :], value=1.0)  # 64 partitions starting at 16
    return out


@nki.jit
def two_psum_inputs(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
    q = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
    s = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=p, value=1.0)
    nisa.memset(dst=q, value=2.0)
    nisa.tensor_tensor(dst=s, data1=p, data2=q, op=nl.add)
    return out


@pytest.mark.parametrize("kernel,rule,line", [
    (sbuf_overflow, "does not fit", "nl.ndarray((128, 80000)"),
    (psum_bank_crossing, "crossing a 2048-byte bank boundary", "nisa.memset(dst=acc"),
    (bad_partition_start, "must start at 0 or 64", "nisa.memset(dst=t[16:80"),
    (two_psum_inputs, "cannot read both inputs from PSUM", "nisa.tensor_tensor"),
])
def test_rule_violations_name_the_rule_and_the_line(kernel, rule, line):
    with pytest.raises(nki.TernError) as err:
        kernel(np.zeros((128, 4), dtype=np.float32))
    msg = str(err.value)
    assert rule in msg
    assert f"test_nki_api.py:{line_of(kernel.fn, line)}" in msg


def test_unimplemented_calls_say_so():
    @nki.jit
    def uses_scan(x):
        nisa.tensor_tensor_scan(None)

    with pytest.raises(NotImplementedError, match="tensor_tensor_scan"):
        uses_scan(np.zeros(4, dtype=np.float32))


def test_unknown_target(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="trn9"):
        sbuf_overflow(np.zeros((128, 4), dtype=np.float32))


def test_target_specific_types():
    @nki.jit
    def e4m3_tile(x):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 4), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.zeros((128, 4), dtype=np.float32)
    assert np.all(nki.jit(e4m3_tile.fn, platform_target="trn3")(x) == 1.0)
    with pytest.raises(nki.TernError, match="float8_e4m3fn is not a trn2"):
        nki.jit(e4m3_tile.fn, platform_target="trn2")(x)


def test_import_nki_resolves_to_tern():
    nki.install()
    import nki as real_name
    import nki.language as nl2
    assert real_name is sys.modules["tern.nki"]
    assert nl2.tile_size.pmax == 128


def test_timing_only_benchmark_ignores_values():
    import tensor_add
    a = np.zeros((1024, 2048), dtype=np.float32)
    summary = nki.benchmark(tensor_add.nki_tensor_add_kernel)(a, a)
    assert summary["latency_ns"] > 0 and summary["instructions"] > 0


def test_iota_and_affine_select():
    @nki.jit
    def patterns(x):
        out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[8 * 3, 2], [3, 8]], offset=5, channel_multiplier=100)
        src = nl.load(x)
        s = nl.ndarray((64, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=s, pattern=[[-8, 2], [-1, 8]], offset=3, channel_multiplier=1, on_true_tile=src,
                           on_false_value=-1.0, cmp_op=nl.greater_equal)
        both = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=both[:, 0:16], src=t.reshape((64, 16)))
        nisa.tensor_copy(dst=both[:, 16:32], src=s.reshape((64, 16)))
        nl.store(out, value=both)
        return out

    x = np.arange(64 * 16, dtype=np.float32).reshape(64, 2, 8)
    got = patterns(x)
    c, w, z = np.meshgrid(np.arange(64), np.arange(2), np.arange(8), indexing="ij")
    assert np.array_equal(got[:, :16].reshape(64, 2, 8), 5 + 100 * c + 24 * w + 3 * z)
    keep = 3 + c - 8 * w - z >= 0
    assert np.array_equal(got[:, 16:].reshape(64, 2, 8), np.where(keep, x, -1.0))
    with pytest.raises(NotImplementedError, match="not linear"):
        @nki.jit
        def skewed(x):
            t = nl.ndarray((64, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
            nisa.iota(dst=t, pattern=[[5, 2], [3, 8]], offset=0)

        skewed(x)


def test_device_print(capsys):
    @nki.jit
    def show(x):
        out = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.device_print("t =", t)
        nl.store(out, value=t)
        return out

    show(np.arange(6, dtype=np.float32).reshape(2, 3))
    printed = capsys.readouterr().out
    assert printed.startswith("t = [[0. 1. 2.]")
