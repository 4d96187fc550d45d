"""nki.collectives across ranks (simulated chips of a system): exact values
against numpy (FP32 sums in rank order, rounded once), the simulated clocks
(a collective starts when its last member arrives and ends on all of them),
and the errors for what tern does not run."""
import numpy as np
import pytest

import collective_matmul

import tern.nki as nki
import tern.nki.collectives as ncc
import tern.nki.isa as nisa
import tern.nki.language as nl


def bf16(x):
    """Round float32 to bfloat16 (nearest even), as float32."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def rank_sum(parts, order):
    """FP32 sum in the given rank order."""
    acc = np.zeros_like(parts[0], dtype=np.float32)
    for r in order:
        acc = (acc + parts[r]).astype(np.float32)
    return acc


@nki.jit
def scaled_all_reduce(a, groups, op):
    """Each rank scales its input by (rank + 1), then all-reduces in bf16."""
    t = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.private_hbm)
    x = nl.load(a)
    y = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(y, x, nl.multiply, float(ncc.rank_id() + 1))
    nl.store(t, y)
    out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
    ncc.all_reduce([t], [out], ncc.ReplicaGroup(groups), op)
    return out


def test_all_reduce_sums_in_rank_order_and_rounds_once():
    rng = np.random.default_rng(1)
    a = bf16(rng.standard_normal((128, 96), dtype=np.float32))
    got = nki.simulate(scaled_all_reduce, ranks=4)(a, [[0, 1, 2, 3]], nl.add)
    parts = [bf16(a * (r + 1)) for r in range(4)]
    want = bf16(rank_sum(parts, [0, 1, 2, 3]))
    for r in range(4):
        assert np.array_equal(nki.to_float32(got[r]), want), r


def test_all_reduce_max_within_each_rank_list():
    a = bf16(np.random.default_rng(2).standard_normal((128, 32), dtype=np.float32))
    group = ncc.ReplicaGroup.from_partition_op(4, ncc.rg_partition_op.mod, 2)
    assert group.groups == [[0, 2], [1, 3]]
    got = nki.simulate(scaled_all_reduce, ranks=4)(a, group.groups, nl.maximum)
    for r in range(4):
        members = [r % 2, r % 2 + 2]
        want = np.maximum(bf16(a * (members[0] + 1)), bf16(a * (members[1] + 1)))
        assert np.array_equal(nki.to_float32(got[r]), want), r


@nki.jit
def gather_scatter_alltoall(a, p):
    """all_gather, reduce_scatter and all_to_all of this rank's [128, 64] tile."""
    x = nl.load(a)
    mine = nl.ndarray(a.shape, nl.float32, buffer=nl.private_hbm)
    nl.store(mine, x)
    everyone = ncc.ReplicaGroup([list(range(p))])
    gathered = nl.ndarray((p * 128, 64), nl.float32, buffer=nl.shared_hbm)
    ncc.all_gather([mine], [gathered], everyone, collective_dim=0)
    scattered = nl.ndarray((128 // p, 64), nl.float32, buffer=nl.shared_hbm)
    ncc.reduce_scatter([mine], [scattered], everyone, collective_dim=0, op=nl.add)
    swapped = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    ncc.all_to_all([mine], [swapped], everyone, collective_dim=0)
    return gathered, scattered, swapped


@pytest.mark.parametrize("p", [2, 4])
def test_gather_scatter_and_all_to_all_move_blocks_along_dim_0(p):
    rng = np.random.default_rng(3)
    ins = [rng.standard_normal((128, 64), dtype=np.float32) for _ in range(p)]
    got = nki.simulate(gather_scatter_alltoall, ranks=p)(nki.per_rank(ins), p)
    total = rank_sum(ins, range(p))
    rows = 128 // p
    for r, (gathered, scattered, swapped) in enumerate(got):
        assert np.array_equal(gathered, np.concatenate(ins))
        assert np.array_equal(scattered, total[r * rows:(r + 1) * rows])
        want = np.concatenate([ins[j][r * rows:(r + 1) * rows] for j in range(p)])
        assert np.array_equal(swapped, want)


@nki.jit
def ring_shift(a, pairs):
    x = nl.load(a)
    src = nl.ndarray(a.shape, nl.float32, buffer=nl.private_hbm)
    nl.store(src, x)
    dst = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(dst, nl.zeros(a.shape, nl.float32))
    ncc.collective_permute([src], [dst], pairs)
    return dst


def test_collective_permute_sends_to_the_targets_only():
    ins = [np.full((128, 16), r + 1, dtype=np.float32) for r in range(4)]
    got = nki.simulate(ring_shift, ranks=4)(nki.per_rank(ins), [(0, 1), (1, 2), (2, 0)])
    assert np.array_equal(got[1], ins[0]) and np.array_equal(got[2], ins[1])
    assert np.array_equal(got[0], ins[2])
    assert np.array_equal(got[3], np.zeros((128, 16), np.float32))  # no pair targets rank 3


@nki.jit
def uneven_work(a, p):
    """Rank r runs r + 1 copies before the all-reduce: the last to arrive sets
    the start."""
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.private_hbm)
    for _ in range(ncc.rank_id() + 1):
        nl.store(t, nl.load(a))
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    ncc.all_reduce([t], [out], ncc.ReplicaGroup([list(range(p))]), nl.add)
    return out


def test_a_collective_waits_for_its_last_member_and_syncs_the_clocks():
    k = nki.benchmark(uneven_work, ranks=4)
    s = k(nki.spec((128, 512), nl.float32), 4)
    parts = s["part_latency_ns"]
    assert parts[0][0] < parts[3][0]  # rank 3 copies four times
    (c,) = s["collectives"]
    assert c["op"] == "all-reduce" and c["chips"] == [0, 1, 2, 3] and c["bytes"] == 128 * 512 * 4
    assert c["start_ns"] == pytest.approx(max(p[0] for p in parts))
    for r in range(4):
        assert s["rank_latency_ns"][r] == pytest.approx(c["start_ns"] + c["duration_ns"] + parts[r][1])


@nki.jit
def compute_beside(a, b, p, dependent):
    """An all-reduce of a, then four copies of b: they overlap the collective
    unless they read its result first (dependent)."""
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.private_hbm)
    nl.store(t, nl.load(a))
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    ncc.all_reduce([t], [out], ncc.ReplicaGroup([list(range(p))]), nl.add)
    other = nl.ndarray(b.shape, nl.float32, buffer=nl.shared_hbm)
    if dependent:
        nl.store(other, nl.load(out))
    for _ in range(4):
        nl.store(other, nl.load(b))
    return out, other


@pytest.mark.parametrize("dependent", [False, True])
def test_later_parts_overlap_a_collective_unless_they_need_it(dependent):
    rng = np.random.default_rng(7)
    a = [rng.standard_normal((128, 512), dtype=np.float32) for _ in range(2)]
    b = rng.standard_normal((128, 512), dtype=np.float32)
    k = nki.simulate(compute_beside, ranks=2)
    got = k(nki.per_rank(a), b, 2, dependent)
    for out, other in got:
        assert np.array_equal(out, rank_sum(a, [0, 1]))
        assert np.array_equal(other, b)
    (c,) = k.last["collectives"]
    for r in range(2):
        p0, p1 = k.last["part_latency_ns"][r]
        assert c["start_ns"] == pytest.approx(p0)
        end = c["start_ns"] + c["duration_ns"]
        want = end + p1 if dependent else max(p0 + p1, end)
        assert k.last["rank_latency_ns"][r] == pytest.approx(want)
    if not dependent:
        assert k.last["latency_ns"] < c["start_ns"] + c["duration_ns"] + p1  # it overlapped


def test_a_tile_cannot_live_across_a_collective():
    @nki.jit
    def kernel(a):
        x = nl.load(a)
        t = nl.ndarray(a.shape, nl.float32, buffer=nl.private_hbm)
        nl.store(t, x)
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        ncc.all_reduce([t], [out], ncc.ReplicaGroup([[0, 1]]), nl.add)
        nl.store(out, x)  # x was in SBUF before the collective
        return out

    with pytest.raises(NotImplementedError, match="across a collective"):
        nki.simulate(kernel, ranks=2)(np.zeros((128, 8), np.float32))


def test_ranks_must_make_the_same_calls():
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        if ncc.rank_id() == 0:
            ncc.all_reduce([out], [out], ncc.ReplicaGroup([[0, 1]]), nl.add)
        return out

    with pytest.raises(ValueError, match="rank 1 makes 0 collective calls but rank 0 makes 1"):
        nki.simulate(kernel, ranks=2)(np.zeros((128, 8), np.float32))


def test_what_tern_does_not_run_says_so():
    def kernel_with(call):
        @nki.jit
        def kernel(a):
            out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.load(a))
            call(a, out)
            return out
        return kernel

    a = np.zeros((128, 8), np.float32)
    g = ncc.ReplicaGroup([[0, 1]])
    cases = [
        (lambda a, o: ncc.all_gather([o], [o], g, collective_dim=1), "collective_dim 1"),
        (lambda a, o: ncc.all_reduce([o[0:64, :]], [o[0:64, :]], g, nl.add), "part of an HBM tensor"),
        (lambda a, o: ncc.all_reduce([nl.load(a)], [o], g, nl.add), "SBUF/PSUM"),
        (lambda a, o: ncc.collective_permute_implicit([o], [o], g), "collective_permute_implicit"),
    ]
    for call, match in cases:
        with pytest.raises(NotImplementedError, match=match):
            nki.simulate(kernel_with(call), ranks=2)(a)
    with pytest.raises(ValueError, match="names rank 2"):
        nki.simulate(kernel_with(lambda a, o: ncc.all_reduce([o], [o], [[0, 2]], nl.add)), ranks=2)(a)
    with pytest.raises(ValueError, match="dst must hold p x src"):
        nki.simulate(kernel_with(lambda a, o: ncc.all_gather([o], [o], g)), ranks=2)(a)
    with pytest.raises(NotImplementedError, match="launch grid"):
        nki.simulate(kernel_with(lambda a, o: ncc.all_reduce([o], [o], g, nl.add))[2], ranks=2)(a)


def test_example_collective_matmul():
    rng = np.random.default_rng(0)
    p, K, M, N = 2, 256, 128, 512
    lhsT = rng.standard_normal((K, M), dtype=np.float32)
    rhs = rng.standard_normal((K, N), dtype=np.float32)
    k = nki.simulate(collective_matmul.row_parallel, ranks=p)
    got = k(nki.per_rank([lhsT[:128], lhsT[128:]]), nki.per_rank([rhs[:128], rhs[128:]]), p)
    # Each rank's partial in FP32 PSUM, then the two added in rank order.
    halves = [lhsT[r * 128:(r + 1) * 128].T @ rhs[r * 128:(r + 1) * 128] for r in range(p)]
    for r in range(p):
        np.testing.assert_allclose(got[r], halves[0] + halves[1], rtol=1e-5, atol=1e-4)
        assert np.array_equal(got[r], got[0])  # every rank holds the same bits
