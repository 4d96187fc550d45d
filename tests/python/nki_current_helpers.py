"""Shared helpers of the current-API compatibility suites (test_nki_current_*.py)."""
import dataclasses
import math

import numpy as np
import pytest
import torch

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl

V2 = ["trn1", "trn2", "trn3"]  # instructions NeuronCore-v2 has
V3 = ["trn2", "trn3"]  # NeuronCore-v3+ instructions (and the default sweep)
P = 128


def run(kernel, target, *args, **kwargs):
    return nki.jit(kernel, platform_target=target)(*args, **kwargs)


def rng(seed):
    return np.random.default_rng(seed)


def ints_as_f32(shape, lo=-8, hi=8, seed=0):
    """Small integer values in float32: sums and products stay exact."""
    return rng(seed).integers(lo, hi, size=shape).astype(np.float32)


def normal(shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def bf16_round(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, via torch."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def load(src, dtype=None):
    """HBM -> a fresh SBUF tile (the library's dma_copy idiom)."""
    t = nl.ndarray(src.shape, dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def store(tile, dtype=None):
    """An SBUF tile -> a new shared_hbm output."""
    out = nl.ndarray(tile.shape, dtype or tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def evacuate(ps):
    """A PSUM tile -> SBUF (tensor_copy) -> a shared_hbm output."""
    sb = nl.ndarray(ps.shape, ps.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=ps)
    return store(sb)


def segment_runs(ids):
    """Run starts and ends (one past) of a segment-id row; id 0 is padding (n, -1)."""
    n = len(ids)
    start, end = np.empty(n), np.empty(n)
    for i in range(n):
        start[i] = n if ids[i] == 0 else (start[i - 1] if i and ids[i] == ids[i - 1] else i)
    for i in reversed(range(n)):
        end[i] = -1 if ids[i] == 0 else (end[i + 1] if i + 1 < n and ids[i] == ids[i + 1] else i + 1)
    return np.stack([start, end])
