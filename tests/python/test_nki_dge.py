"""dge_mode=hwdge: the hardware descriptor generator's time before each
transfer (Descriptor Generation Engine reference; docs/sim.md), and the
places NKI does not allow it."""
import os
import tomllib

import numpy as np
import pytest

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl

P, F = 128, 256


def _dma(chip):
    path = os.path.join(os.environ["TERN_DATA_DIR"], "arch", f"{chip}.toml")
    with open(path, "rb") as f:
        return tomllib.load(f)["dma"]


def _round_trip(mode, engine=None):
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        kw = {} if engine is None else {"engine": engine}
        nisa.dma_copy(dst=t, src=x, dge_mode=mode, **kw)
        nisa.dma_copy(dst=out, src=t, dge_mode=mode, **kw)
        return out
    return kernel


def _latency_ns(kernel, chip, x):
    return nki.benchmark(kernel, platform_target=chip)(x)["latency_ns"]


@pytest.mark.parametrize("chip", ["trn2", "trn3"])
def test_hwdge_adds_the_generators_time_to_each_dependent_transfer(chip):
    x = np.arange(P * F, dtype=np.float32).reshape(P, F)
    gen = _dma(chip)["descriptor_gen_ns"]
    static = _latency_ns(_round_trip(nisa.dge_mode.unknown), chip, x)
    hw = _latency_ns(_round_trip(nisa.dge_mode.hwdge), chip, x)
    scalar = _latency_ns(_round_trip(nisa.dge_mode.hwdge, nisa.engine.scalar), chip, x)
    # The store waits for the load, so the two generator times add up.
    assert hw == pytest.approx(static + 2 * gen, abs=1e-6)
    assert scalar == pytest.approx(hw, abs=1e-6)
    for mode in (nisa.dge_mode.none, nisa.dge_mode.swdge):
        assert _latency_ns(_round_trip(mode), chip, x) == pytest.approx(static, abs=1e-6)
    got = nki.jit(_round_trip(nisa.dge_mode.hwdge), platform_target=chip)(x)
    assert np.array_equal(np.asarray(got), x)


def test_hwdge_is_refused_where_nki_refuses_it():
    x = np.zeros((P, F), np.float32)
    with pytest.raises(Exception, match="no hardware DGE"):
        nki.jit(_round_trip(nisa.dge_mode.hwdge), platform_target="trn1")(x)
    with pytest.raises(Exception, match="Scalar or Sync engine, not gpsimd"):
        nki.jit(_round_trip(nisa.dge_mode.hwdge, nisa.engine.gpsimd), platform_target="trn3")(x)
