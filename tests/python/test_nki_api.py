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
    import tern.nki.collectives as cc

    @nki.jit
    def uses_all_to_all_v(x):
        cc.all_to_all_v(x)

    with pytest.raises(NotImplementedError, match="not supported: nki.collectives.all_to_all_v"):
        uses_all_to_all_v(np.zeros(4, dtype=np.float32))


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

    @nki.jit
    def skewed(x):
        """Steps that do not nest (5 is not 3 * 8): one iota per index of the shorter dim."""
        t = nl.ndarray((64, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[5, 2], [3, 8]], offset=1, channel_multiplier=2)
        out = nl.ndarray((64, 2, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out

    assert np.array_equal(skewed(x), 1 + 2 * c + 5 * w + 3 * z)
    with pytest.raises(NotImplementedError, match="not linear"):
        @nki.jit
        def skewed_mask(x):
            t = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.sbuf)
            nisa.affine_select(dst=t, pattern=[[5, 2], [3, 8]], offset=0, on_true_tile=t, on_false_value=0.0)

        skewed_mask(x)


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


def test_dma_compute_and_scalar_bias():
    @nki.jit
    def add3(a, b, c):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_compute(dst=t, srcs=[a, b, c], reduce_op=nl.add)
        u = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=u, op=nl.copy_fn, data=t, bias=0.5, scale=2.0)
        nl.store(out, value=u)
        return out

    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((128, 64), dtype=np.float32) for _ in range(3))
    want = ((a + b).astype(np.float32) + c).astype(np.float32) * 2 + 0.5
    assert np.array_equal(add3(a, b, c), want.astype(np.float32))


def test_benchmark_writes_a_perfetto_trace(tmp_path):
    import json
    import tensor_add
    path = tmp_path / "t.json"
    a = np.zeros((256, 1024), dtype=np.float32)
    nki.benchmark(tensor_add.nki_tensor_add_kernel, trace=str(path))(a, a)
    trace = json.loads(path.read_text())
    assert any(e["ph"] == "X" and e["name"] == "tensor_tensor" for e in trace["traceEvents"])


def test_composed_calls():
    @nki.jit
    def composed(x, y):
        out = nl.ndarray((128, 34), dtype=nl.float32, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        r = nl.ndarray((128, 34), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=r[:, 0:32], data=a, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=b)
        nisa.tensor_scalar_reduce(dst=a, data=a, op0=nl.add, operand0=1.0, reduce_op=nl.maximum,
                                  reduce_res=r[:, 32:33])
        e = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=e, op=nl.square, data=b, reduce_op=nl.add, reduce_res=r[:, 33:34])
        nl.store(out, value=r)
        return out

    rng = np.random.default_rng(4)
    x, y = (rng.standard_normal((128, 32), dtype=np.float32) for _ in range(2))
    got = composed(x, y)
    assert np.array_equal(got[:, :32], (x * np.float32(3)).astype(np.float32) + y)
    assert np.array_equal(got[:, 32], (x + np.float32(1)).max(axis=1))
    assert np.allclose(got[:, 33], (y.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)


def test_simulate_and_several_outputs():
    def two_outputs(x):
        s = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        d = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)
        nl.store(s, value=u)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.subtract)
        nl.store(d, value=u)
        return s, d

    x = np.random.default_rng(9).standard_normal((64, 48), dtype=np.float32)
    s, d = nki.simulate(two_outputs)(x)
    assert np.array_equal(s, x + x) and np.array_equal(d, np.zeros_like(x))


def test_as_nki_one_liner_runs_an_unmodified_kernel(tmp_path):
    import subprocess
    kernel = tmp_path / "k.py"
    kernel.write_text(
        "import numpy as np\n"
        "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n"
        "@nki.jit\n"
        "def k(a):\n"
        "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "    t = nl.load(a)\n"
        "    nisa.activation(dst=t, op=nl.relu, data=t)\n"
        "    nl.store(out, value=t)\n"
        "    return out\n"
        "x = np.arange(-8, 8, dtype=np.float32).reshape(2, 8)\n"
        "assert np.array_equal(k(x), np.maximum(x, 0))\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", f"import tern.nki.as_nki; exec(open(r'{kernel}').read())"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


@nki.jit
def holds_dead_psum(x):
    """A PSUM tile used once and still bound while the kernel asks for all eight banks: the NKI
    compiler allocates by liveness, so this fits."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    xs = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    early = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=early, data=xs)
    ys = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ys, src=early)
    banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
    acc = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for i, b in enumerate(banks):
        nisa.memset(dst=b, value=float(i))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=b, op=nl.add)
    nisa.tensor_tensor(dst=acc[:, 0:128], data1=acc[:, 0:128], data2=ys, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def nine_live_banks(x):
    """Nine PSUM banks all used at the end: no allocation can fit them."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
    acc = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for b in banks:
        nisa.memset(dst=b, value=1.0)
    for b in banks:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_tiles_free_after_their_last_use_when_memory_is_full():
    x = np.random.default_rng(5).standard_normal((128, 128)).astype(np.float32)
    got = holds_dead_psum(x)
    assert np.array_equal(got[:, 128:], np.full((128, 384), 28.0, np.float32))
    assert np.array_equal(got[:, :128], np.float32(28.0) + x.T)
    with pytest.raises(nki.TernError, match="psum allocation of 2048 bytes per partition does not fit"):
        nine_live_banks(x)
