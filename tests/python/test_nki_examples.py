"""Every NKI example (examples/nki) on trn2 and trn3 against numpy."""
import numpy as np
import pytest

import attention
import legacy_layernorm
import lnc2_exchange
import matmul
import mxfp8_matmul
import norms
import softmax
import tensor_add
import transpose2d

import tern.nki as nki
import tern.nki.language as nl


@pytest.fixture(params=["trn2", "trn3"])
def target(request, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", request.param)
    return request.param


def test_tensor_add(target):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)
    assert np.array_equal(tensor_add.nki_tensor_add_kernel(a, b), a + b)
    grid = tensor_add.nki_tensor_add_kernel[2]
    assert np.array_equal(grid(a, b), a + b)
    # Two logical cores each do half the work: faster than one.
    assert grid.last["latency_ns"] < tensor_add.nki_tensor_add_kernel.last["latency_ns"]
    assert grid.last["cores"] == 2


def test_transpose2d(target):
    x = np.random.default_rng(6).standard_normal((256, 384), dtype=np.float32)
    assert np.array_equal(transpose2d.transpose2d_kernel(x), x.T)


def test_matmul_single_tile(target):
    a, b = matmul.bf16_values((128, 128), 7), matmul.bf16_values((128, 512), 8)
    assert np.array_equal(matmul.matmul_single_tile(a, b), matmul.reference(a, b))


@pytest.mark.parametrize("stage", matmul.STAGES, ids=lambda s: s.fn.__name__)
def test_matmul_stages_bit_exact(target, stage):
    a, b = matmul.bf16_values((256, 256), 9), matmul.bf16_values((256, 2048), 10)
    got = stage(nki.typed(a, nl.bfloat16), nki.typed(b, nl.bfloat16))
    assert np.array_equal(got, matmul.reference(a, b))


def test_matmul_stages_get_faster_on_a_larger_shape():
    times = [nki.benchmark(stage, platform_target="trn3")(nki.spec((2048, 512), nl.bfloat16),
                                                          nki.spec((2048, 4096), nl.bfloat16))["latency_ns"]
             for stage in matmul.STAGES]
    assert times == sorted(times, reverse=True), times


def test_norms(target):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((200, 640), dtype=np.float32) * 2 + 0.5
    g, b = (rng.standard_normal((1, 640), dtype=np.float32) for _ in range(2))
    assert np.abs(norms.rmsnorm_kernel(x, g) - norms.rmsnorm_ref(x, g)).max() < 1e-4
    assert np.abs(norms.layernorm_kernel(x, g, b) - norms.layernorm_ref(x, g, b)).max() < 1e-4


def test_softmax(target):
    x = np.random.default_rng(12).standard_normal((200, 777), dtype=np.float32) * 3
    assert np.abs(softmax.softmax_kernel(x) - softmax.reference(x)).max() < 1e-5


def test_causal_flash_attention(target):
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((256, 128), dtype=np.float32) for _ in range(3))
    o = attention.flash_attention_fwd(np.ascontiguousarray(q.T), np.ascontiguousarray(k.T), v)
    assert np.abs(o - attention.reference(q, k, v)).max() < 1e-4


def test_mxfp8_matmul_on_trn3():
    a, b = mxfp8_matmul.bf16_values((512, 96), 14, 3.0), mxfp8_matmul.bf16_values((512, 300), 15, 0.1)
    got = mxfp8_matmul.mxfp8_matmul(nki.typed(a, nl.bfloat16), nki.typed(b, nl.bfloat16))
    assert np.array_equal(got, mxfp8_matmul.reference(a, b))


def test_mxfp8_needs_trn3():
    kernel = nki.jit(mxfp8_matmul.mxfp8_matmul.fn, platform_target="trn2")
    a = mxfp8_matmul.bf16_values((512, 96), 1)
    with pytest.raises(nki.TernError, match="not a trn2"):
        kernel(nki.typed(a, nl.bfloat16), nki.typed(a, nl.bfloat16))


def test_legacy_layernorm(target):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((200, 128), dtype=np.float32)
    w = rng.standard_normal(128, dtype=np.float32)
    b = rng.standard_normal(128, dtype=np.float32)
    y = legacy_layernorm.layernorm_rows(x, w, b, 1e-5)
    np.testing.assert_allclose(y, legacy_layernorm.reference(x, w, b, 1e-5), rtol=1e-4, atol=1e-4)


def test_lnc2_exchange(target):
    x = np.random.default_rng(12).uniform(0.5, 4.0, (256, 32)).astype(np.float32)
    k = lnc2_exchange.scale_by_global_max[2]
    out, seen = k(x)
    halves = x.reshape(2, 128, 32).max(axis=2)
    assert np.array_equal(seen[:, 0], np.concatenate([halves[1], halves[0]]))
    np.testing.assert_allclose(out, x / x.max(), rtol=1e-6)
    assert k.last["cores"] == 2
