"""MX block quantization on chip (the mx_quantize kernel: every scale policy,
MXFP8 E4M3 / E5M2 and MXFP4) against an independent numpy implementation
written from the OCP MX v1.0 spec and docs/reference/numerics.md
section 3, not from tern::num. The dequantized values 2^k * P_i must be
equal element for element (tolerance 0: both are exact), NaN where the
block holds NaN or Inf."""
import numpy as np
import pytest

from tern import _core

# element type: (exponent bits, mantissa bits, bias, largest finite, emax_elem)
FORMATS = {
    "fp8_e4m3_x4": (4, 3, 7, 448.0, 8),
    "fp8_e5m2_x4": (5, 2, 15, 57344.0, 15),
    "fp4_e2m1_x4": (2, 1, 1, 6.0, 2),
}


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def grid(elem):
    """The non-negative finite values, indexed by magnitude code."""
    e, m, bias, vmax, _ = FORMATS[elem]
    vals = []
    for code in range(2 ** (e + m)):
        ef, mf = code >> m, code & ((1 << m) - 1)
        v = (mf / 2**m) * 2.0 ** (1 - bias) if ef == 0 else (1 + mf / 2**m) * 2.0 ** (ef - bias)
        if v <= vmax:
            vals.append(v)
    return np.array(vals)


def round_to_grid(v, g):
    """Nearest value of g (sorted, >= 0) to |v| >= 0, ties to the even code,
    saturating at the largest."""
    v = np.minimum(v, g[-1])
    i = np.clip(np.searchsorted(g, v), 1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    pick_hi = (hi - v < v - lo) | ((hi - v == v - lo) & (i % 2 == 0))
    return np.where(pick_hi, hi, lo)


def scale_exponent(amax, elem, policy):
    _, _, _, vmax, emax = FORMATS[elem]
    if not np.isfinite(amax):
        return None
    if amax == 0:
        return -127
    e = np.frexp(amax)[1] - 1  # floor(log2 amax), exactly
    if policy == "ocp-floor":
        k = e - emax
    elif policy == "trn3":
        k = e - (emax - 1) if elem != "fp4_e2m1_x4" else e - emax
    else:  # rceil: the smallest k with amax <= vmax * 2^k
        k = e - (np.frexp(vmax)[1] - 1) - 1
        while amax > np.ldexp(vmax, k):
            k += 1
    return None if k > 127 else max(k, -127)


def numpy_mx(x, elem, policy):
    """Dequantized MX values of x [K, C], blocks of 32 along K."""
    g = grid(elem)
    out = np.empty(x.shape, np.float64)
    for b in range(x.shape[0] // 32):
        for c in range(x.shape[1]):
            blk = x[32 * b : 32 * b + 32, c].astype(np.float64)
            k = scale_exponent(np.abs(blk).max(), elem, policy)
            if k is None:
                out[32 * b : 32 * b + 32, c] = np.nan
                continue
            y = np.ldexp(blk, -k)
            out[32 * b : 32 * b + 32, c] = np.sign(y) * np.ldexp(round_to_grid(np.abs(y), g), k)
    return out


def decode_chip(q, qs, K, C, elem):
    g = grid(elem)
    if elem == "fp4_e2m1_x4":
        b = q.reshape(K // 4, C, 2)
        nib = np.stack([b[..., j // 2] >> (4 * (j % 2)) & 0xF for j in range(4)], axis=-1)
        codes, sbit, mmask = nib, 0x8, 0x7
    else:
        codes, sbit, mmask = q.reshape(K // 4, C, 4), 0x80, 0x7F
    codes = codes.transpose(0, 2, 1).reshape(K, C).astype(np.int64)  # row 4 k4 + j
    mag = g[codes & mmask] * np.where(codes & sbit, -1.0, 1.0)
    s = np.repeat(qs.reshape(K // 32, C).astype(np.int64), 32, axis=0)
    return np.where(s == 255, np.nan, np.ldexp(mag, s - 127))


def inputs(K, C, seed):
    rng = np.random.default_rng(seed)
    # Blocks of very different magnitudes, and the edges: a zero block, a
    # NaN, an Inf, BF16 subnormals, amax at and past the element maximum's
    # mantissa (the rceil decision), values near the BF16 maximum.
    scale = np.ldexp(1.0, rng.integers(-30, 30, size=(K // 32, 1, C)))
    x = (rng.standard_normal((K // 32, 32, C)) * scale).reshape(K, C)
    x[0:32, 0] = 0.0
    x[5, 1] = np.nan
    x[40, 1] = -np.inf
    x[64:96, 2] *= 1e-39
    x[0, 3] = 448.0 * 2.0**-4
    x[32, 3] = 1.7578125 * 2.0**100
    x[64, 3] = 3.3e38
    return bf16(x.astype(np.float32))


@pytest.mark.parametrize("elem", list(FORMATS))
@pytest.mark.parametrize("policy", ["trn3", "ocp-floor", "rceil"])
def test_mx_quantize_on_chip_matches_numpy(elem, policy):
    K, C = 256, 70
    x = inputs(K, C, 3)
    chip = _core.load_chip("trn3")
    sim = _core.Simulator(chip)
    sim.load(_core.build_kernel(chip, "mx_quantize", k=K, dim=C, elem=elem, policy=policy, cores=2))
    sim.write("x", x.ravel())
    sim.run()
    got = decode_chip(sim.read_bytes("q"), sim.read_bytes("q_scale"), K, C, elem)
    want = numpy_mx(x, elem, policy)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    bad = np.flatnonzero(got[ok] != want[ok])
    assert bad.size == 0, f"{bad.size} values differ, first: got {got[ok][bad[0]]} want {want[ok][bad[0]]}"
