"""Current NKI API: random numbers (rng, rand2, rand_set_state /
rand_get_state, set_rng_seed, dropout, nl.rand, nl.random_seed). The
engines' generators are XORWOW per partition: the bits are checked against
an independent numpy XORWOW from a known state; seeding and floats against
their documented mapping; dropout statistically."""
import numpy as np
import pytest
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


def xorwow(state, n):
    """n outputs of Marsaglia's xorwow from [x, y, z, w, v, d] (uint32), and the state after."""
    x, y, z, w, v, d = (int(s) for s in state)
    out = []
    m = 0xFFFFFFFF
    for _ in range(n):
        t = x ^ (x >> 2)
        x, y, z, w = y, z, w, v
        v = ((v ^ (v << 4)) ^ (t ^ (t << 1))) & m
        d = (d + 362437) & m
        out.append((v + d) & m)
    return np.array(out, np.uint32), np.array([x, y, z, w, v, d], np.uint32)


def states(p, words, seed):
    return rng(seed).integers(1, 2**32, size=(p, words), dtype=np.uint64).astype(np.uint32)


def k_bits(state, engine, n):
    st = load(state)
    nisa.rand_set_state(src_seeds=st, engine=engine)
    bits = nl.ndarray((state.shape[0], n), nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=bits, engine=engine)
    after = nl.ndarray(state.shape, nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=after, engine=engine)
    return store(bits), store(after)


@pytest.mark.parametrize("target", V3)
def test_gpsimd_rng_is_xorwow_from_the_state_set(target):
    s = states(P, 6, 300)
    bits, after = run(k_bits, target, s, nisa.engine.gpsimd, 10)
    for p in (0, 1, 77, 127):
        want, end = xorwow(s[p], 10)
        assert np.array_equal(bits[p], want) and np.array_equal(after[p], end)


def test_trn3_vector_lanes_hold_four_states():
    """NeuronCore-v4's Vector engine: 24 words a lane; element i draws from state i % 4."""
    s = states(P, 24, 301)
    bits, after = run(k_bits, "trn3", s, nisa.engine.vector, 12)
    for p in (0, 5, 127):
        for j in range(4):
            want, end = xorwow(s[p, 6 * j:6 * j + 6], 3)
            assert np.array_equal(bits[p, j::4], want) and np.array_equal(after[p, 6 * j:6 * j + 6], end)


def k_uniform(state, lo, hi):
    nisa.rand_set_state(src_seeds=load(state), engine=nisa.engine.vector)
    u = nl.ndarray((state.shape[0], 8), nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=u, min=lo, max=hi)
    return store(u)


def test_rand2_maps_the_top_24_bits_into_the_range():
    s = states(P, 24, 302)
    got = run(k_uniform, "trn3", s, -2.0, 3.0)
    for p in (0, 64):
        raw = np.empty(8, np.uint32)
        for j in range(4):
            raw[j::4] = xorwow(s[p, 6 * j:6 * j + 6], 2)[0]
        unit = (raw >> 8).astype(np.float32) * np.float32(2.0**-24)
        assert np.array_equal(got[p], np.float32(-2.0) + unit * np.float32(5.0))


def k_seeded(seed, lo, hi):
    nisa.set_rng_seed(load(seed))
    u = nl.ndarray((P, 256), nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=u, min=lo if isinstance(lo, float) else load(lo), max=hi)
    return store(u)


def test_set_rng_seed_makes_rand2_reproducible():
    a = run(k_seeded, "trn3", np.array([[7]], np.int32), 0.0, 1.0)
    b = run(k_seeded, "trn3", np.array([[7]], np.int32), 0.0, 1.0)
    c = run(k_seeded, "trn3", np.array([[8]], np.int32), 0.0, 1.0)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0.0 and a.max() < 1.0 and abs(a.mean() - 0.5) < 0.01
    assert not np.array_equal(a[0], a[1])  # lanes draw different streams
    lo = np.linspace(-10, 10, P, dtype=np.float32).reshape(P, 1)
    per_row = run(k_seeded, "trn3", np.array([[7]], np.int32), lo, 20.0)
    assert np.all(per_row >= lo) and np.all(per_row < 20.0)


def k_dropout(x, prob):
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.dropout(dst=d, data=load(x), prob=prob if isinstance(prob, float) else load(prob))
    return store(d)


@pytest.mark.parametrize("target", V2)
def test_dropout_zeroes_about_prob_of_the_elements(target):
    x = rng(303).uniform(1.0, 2.0, size=(P, 512)).astype(np.float32)
    got = run(k_dropout, target, x, 0.3)
    kept = got != 0
    assert abs(1 - kept.mean() - 0.3) < 0.01  # 65536 draws: standard deviation 0.0018
    assert np.array_equal(got[kept], x[kept])
    col = np.where(np.arange(P) < 64, 0.1, 0.9).astype(np.float32).reshape(P, 1)
    per = run(k_dropout, target, x, col) == 0
    assert abs(per[:64].mean() - 0.1) < 0.02 and abs(per[64:].mean() - 0.9) < 0.02


def k_language_rand(seed):
    nl.random_seed(load(seed))
    return store(nl.rand((P, 64), nl.float32))


@pytest.mark.parametrize("target", V2)
def test_language_rand_and_random_seed(target):
    a = run(k_language_rand, target, np.array([[3]], np.uint32))
    assert np.array_equal(a, run(k_language_rand, target, np.array([[3]], np.uint32)))
    assert a.min() >= 0 and a.max() < 1


def k_rand2_only(x):
    u = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=u, min=0.0, max=1.0)
    return store(u)


def k_float_bits(x):
    u = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.rng(dst=u)
    return store(u)


def k_state_on_trn1(state):
    nisa.rand_set_state(src_seeds=load(state))
    return store(load(state))


def test_random_rules():
    with pytest.raises(ValueError, match="NeuronCore-v4"):
        run(k_rand2_only, "trn2", np.zeros((P, 4), np.float32))
    with pytest.raises(Exception, match="rng writes 8-, 16- or 32-bit integers"):
        run(k_float_bits, "trn3", np.zeros((P, 4), np.float32))
    with pytest.raises(Exception, match="NeuronCore-v3"):
        run(k_state_on_trn1, "trn1", states(P, 6, 304))
