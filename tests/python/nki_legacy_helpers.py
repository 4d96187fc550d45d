"""Shared helpers and fixtures of the legacy-generation suites
(test_nki_legacy_*.py): tern.nki.install(), the neuronxcc imports, targets."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tern.nki

tern.nki.install()

import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402
import neuronxcc.nki.typing as nt  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency here
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

TARGETS = ("trn1", "trn2", "trn3")
RTOL = 1e-5  # transcendental functions (Scalar-engine activation tables)

@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


@pytest.fixture(params=TARGETS)
def env_target(request, monkeypatch):
    """The target chosen the legacy way: NEURON_PLATFORM_TARGET_OVERRIDE."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", request.param)
    return request.param


def run(kernel, target, *args, grid=None, **kwargs):
    k = nki.jit(kernel, platform_target=target)
    if grid is not None:
        k = k[grid]
    return k(*args, **kwargs)


def exact(shape, lo=-64, hi=64, denom=8.0, dtype=np.float32, seed=0):
    """Values k/denom for small integers k: every sum / product of a few of
    them is exact in fp32 (and fp16 / bf16 hold them exactly)."""
    r = np.random.default_rng(seed)
    return (r.integers(lo, hi, size=shape) / denom).astype(dtype)


def ints(shape, lo=-8, hi=9, seed=0):
    r = np.random.default_rng(seed)
    return r.integers(lo, hi, size=shape).astype(np.float32)


def pow2(shape, seed=0):
    """Nonzero powers of two (+-1/4 .. +-8): divisions by them are exact."""
    r = np.random.default_rng(seed)
    e = r.integers(-2, 4, size=shape)
    s = r.choice([-1.0, 1.0], size=shape)
    return (s * np.exp2(e)).astype(np.float32)


def assert_exact(got, want):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def hbm_like(t):
    """A shared-HBM output with the tile's shape and dtype."""
    return nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)


def store_new(t):
    out = hbm_like(t)
    nl.store(out, value=t)
    return out
