"""What tern does to a legacy kernel's instructions as the NKI compiler
does: a partition broadcast is a Tensor-engine matmul into PSUM, a
loop-invariant instruction is issued once, `view[...] = nisa.op(...)`
writes the view (no copy), and loop tiles get more than one buffer. The
bits are those of the plain way; the instructions and times are checked
exactly."""
import json

import numpy as np
import pytest

from nki_legacy_helpers import nisa, nki, nl  # noqa: F401

P, F = 128, 512


def _events(kernel, tmp_path, *args, target="trn1"):
    """The kernel's simulated instructions, in start order: (engine, opcode,
    operands, start ns, duration ns)."""
    path = tmp_path / "trace.json"
    nki.benchmark(kernel, platform_target=target, trace=str(path))(*args)
    t = json.loads(path.read_text())
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    evs = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    evs.sort(key=lambda e: e["ts"])
    return [(names[e["tid"]], e["name"], e["args"].get("operands", ""), e["ts"], e["dur"]) for e in evs]


def _compute(events):
    return [(eng, op) for eng, op, *_ in events if not eng.startswith("dma")]


def _data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------ broadcast
def row_times_tile(x, r):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    row = nl.load(r)
    y = nisa.tensor_tensor(t, row.broadcast_to(t.shape), op=nl.multiply)
    nl.store(out, y)
    return out


def test_partition_broadcast_is_a_tensor_engine_matmul_into_psum(tmp_path):
    x, r = _data((P, F)), _data((1, F), 1)
    out = nki.jit(row_times_tile, platform_target="trn1")(x, r)
    np.testing.assert_array_equal(out, x * r)  # ones x row is exact
    ev = _events(row_times_tile, tmp_path, x, r)
    assert _compute(ev) == [("vector", "memset"), ("tensor", "load_stationary"),
                            ("tensor", "multiply_moving"), ("vector", "tensor_tensor")]
    # The Vector engine reads one operand from PSUM: N cycles, not 2N
    # (trn1 Vector at 1.12 GHz; it waits for the matmul, so it pays no
    # dependent-instruction overhead on its own engine).
    tt = [e for e in ev if e[1] == "tensor_tensor"][0]
    assert "psum[128,512]" in tt[2]
    assert tt[4] * 1e3 == pytest.approx(F / 1.12, rel=1e-12)  # the trace counts us


def test_a_row_longer_than_a_psum_bank_is_broadcast_by_dma(tmp_path):
    x, r = _data((P, 2 * F)), _data((1, 2 * F), 2)
    out = nki.jit(row_times_tile, platform_target="trn1")(x, r)
    np.testing.assert_array_equal(out, x * r)
    ev = _events(row_times_tile, tmp_path, x, r)
    assert ("tensor", "multiply_moving") not in _compute(ev)
    assert all("psum" not in ops for _, _, ops, _, _ in ev)


def test_a_bf16_row_is_broadcast_by_dma_and_keeps_its_dtype(tmp_path):
    import tern.nki
    g = np.random.default_rng(3)
    # Small integers and powers of two: every product is exact in bf16.
    x = g.integers(-8, 9, (P, F)).astype(np.float32)
    r = g.choice([-2.0, -0.5, 0.5, 1.0, 4.0], (1, F)).astype(np.float32)
    xb, rb = tern.nki.typed(x, nl.bfloat16), tern.nki.typed(r, nl.bfloat16)
    out = nki.jit(row_times_tile, platform_target="trn2")(xb, rb)
    # A PSUM broadcast would hold FP32 and make the product FP32; the SBUF
    # one keeps the result bf16 (16-bit codes).
    codes = np.asarray(out)
    assert codes.dtype == np.uint16
    np.testing.assert_array_equal((codes.astype(np.uint32) << 16).view(np.float32), x * r)
    ev = _events(row_times_tile, tmp_path, xb, rb, target="trn2")
    assert ("tensor", "multiply_moving") not in _compute(ev)


# ------------------------------------------------------------ loop-invariant code motion
def invariant_product(a, b, c):
    """acc = sum over 4 iterations of (a * b) * c[k]: a * b is the same in
    every iteration."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    acc = nl.zeros(a.shape, dtype=a.dtype)
    for k in nl.affine_range(4):
        ck = nl.load(c[:, k:k + 1])
        xy = nisa.tensor_tensor(x, y, op=nl.multiply)
        acc[...] = nisa.tensor_scalar(xy, op0=nl.multiply, operand0=ck, op1=nl.add, operand1=0.0) + acc
    nl.store(out, acc)
    return out


def _reference_invariant(a, b, c):
    acc = np.zeros_like(a)
    for k in range(4):
        acc = (a * b) * c[:, k:k + 1] + acc
    return acc


def test_a_loop_invariant_instruction_is_issued_once(tmp_path):
    a, b, c = _data((P, F)), _data((P, F), 1), _data((P, 4), 2)
    out = nki.jit(invariant_product, platform_target="trn1")(a, b, c)
    np.testing.assert_array_equal(out, _reference_invariant(a, b, c))
    ops = _compute(_events(invariant_product, tmp_path, a, b, c))
    # One a * b for the whole loop; one tensor_scalar and one add per iteration.
    assert ops.count(("vector", "tensor_tensor")) == 1 + 4
    assert ops.count(("vector", "tensor_scalar")) == 4


def test_an_invariant_instruction_is_issued_once_when_tiles_are_freed_by_liveness(tmp_path):
    """8192 FP32 columns: the loop's tiles do not all fit in trn1's 192 KiB a
    partition, so tern frees each tile after its last use (as the compiler's
    liveness does). b's last use is then the hoisted a * b of the first
    iteration; later iterations still get that product (and never read b's
    freed memory)."""
    wide = 8192
    a, b, c = _data((P, wide)), _data((P, wide), 1), _data((P, 4), 2)
    out = nki.jit(invariant_product, platform_target="trn1")(a, b, c)
    np.testing.assert_array_equal(out, _reference_invariant(a, b, c))
    ops = _compute(_events(invariant_product, tmp_path, a, b, c))
    assert ops.count(("vector", "tensor_tensor")) == 1 + 4


def written_between(a, b):
    """x changes inside the loop: x * y is not invariant."""
    out = nl.ndarray((4,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    for k in nl.affine_range(4):
        xy = nisa.tensor_tensor(x, y, op=nl.multiply)
        nl.store(out[k], xy)
        x[...] = nisa.tensor_scalar(x, op0=nl.add, operand0=1.0)
    return out


def test_an_input_written_in_the_loop_is_not_hoisted(tmp_path):
    a, b = _data((P, F)), _data((P, F), 1)
    out = nki.jit(written_between, platform_target="trn1")(a, b)
    want, x = [], a.copy()
    for _ in range(4):
        want.append(x * b)
        x = x + np.float32(1)
    want = np.stack(want)
    np.testing.assert_array_equal(out, want)
    ops = _compute(_events(written_between, tmp_path, a, b))
    assert ops.count(("vector", "tensor_tensor")) == 4


def kept_view(a, b):
    """A view of the first iteration's result is still held: handing the
    tile out again would alias it."""
    out = nl.ndarray((4,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    kept = []
    for k in nl.affine_range(4):
        xy = nisa.tensor_tensor(x, y, op=nl.multiply)
        kept.append(xy[:, 0:F])
        nl.store(out[k], xy)
    return out


def test_a_result_still_viewed_is_not_handed_out_again(tmp_path):
    a, b = _data((P, F)), _data((P, F), 1)
    out = nki.jit(kept_view, platform_target="trn1")(a, b)
    np.testing.assert_array_equal(out, np.stack([a * b] * 4))
    assert _compute(_events(kept_view, tmp_path, a, b)).count(("vector", "tensor_tensor")) == 4


def static_inner(a, b):
    """static_range is unrolled by the compiler: its body belongs to the
    affine loop around it, so x[:, j] * y[:, j] is hoisted out of that."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    acc = nl.zeros(a.shape, dtype=a.dtype)
    for _ in nl.affine_range(3):
        for j in nl.static_range(2):
            h = F // 2
            acc[:, j * h:(j + 1) * h] += nisa.tensor_tensor(x[:, j * h:(j + 1) * h], y[:, j * h:(j + 1) * h],
                                                            op=nl.multiply)
    nl.store(out, acc)
    return out


def test_static_range_bodies_belong_to_the_enclosing_loop(tmp_path):
    a, b = _data((P, F)), _data((P, F), 1)
    out = nki.jit(static_inner, platform_target="trn1")(a, b)
    p = a * b
    np.testing.assert_array_equal(out, (p + p) + p)
    ops = _compute(_events(static_inner, tmp_path, a, b))
    # Two products (one per static chunk) and six accumulating adds.
    assert ops.count(("vector", "tensor_tensor")) == 2 + 6


# ------------------------------------------------------------ assignment into a view
def assign_into_psum(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    prod = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.psum)
    prod[...] = nisa.tensor_tensor(x, y, op=nl.multiply)
    nl.store(out, nl.copy(prod))
    return out


def assign_widening(a, b):
    """A bf16 result assigned into an FP32 view is rounded to bf16 first:
    the copy stays."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    wide = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    wide[...] = nisa.tensor_tensor(x, y, op=nl.multiply, dtype=nl.bfloat16)
    nl.store(out, wide)
    return out


def test_assigning_a_new_tile_into_a_view_writes_the_view(tmp_path):
    a, b = _data((P, F)), _data((P, F), 1)
    out = nki.jit(assign_into_psum, platform_target="trn1")(a, b)
    np.testing.assert_array_equal(out, a * b)
    ev = _events(assign_into_psum, tmp_path, a, b)
    tt = [e for e in ev if e[1] == "tensor_tensor"]
    assert len(tt) == 1 and tt[0][2].startswith("psum[128,512]")
    # The only copy is the kernel's own nl.copy out of PSUM.
    assert _compute(ev).count(("vector", "tensor_copy")) == 1


def test_a_narrower_result_keeps_its_copy(tmp_path):
    a, b = _data((P, F)), _data((P, F), 1)
    out = nki.jit(assign_widening, platform_target="trn1")(a, b)
    np.testing.assert_array_equal(out, _bf16(a * b))
    assert _compute(_events(assign_widening, tmp_path, a, b)).count(("vector", "tensor_copy")) == 1


def _bf16(v):
    """v rounded to bf16 (nearest, ties to even), as FP32."""
    u = v.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)
