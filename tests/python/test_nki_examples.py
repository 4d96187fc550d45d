"""The NKI examples (examples/nki) on trn2 and trn3 against numpy."""
import numpy as np
import pytest

import matmul
import tensor_add
import transpose2d


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


@pytest.mark.parametrize("stage", ["matmul_single_tile", "matmul_tiled"])
def test_matmul_stages(target, stage):
    kernel = getattr(matmul, stage)
    shape = ((128, 128), (128, 512)) if stage == "matmul_single_tile" else ((256, 384), (256, 1024))
    a, b = matmul.bf16_values(shape[0], 7), matmul.bf16_values(shape[1], 8)
    assert np.array_equal(kernel(a, b), matmul.reference(a, b))
    assert kernel.last["latency_ns"] > 0
