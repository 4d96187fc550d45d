"""Current NKI API: sequencer registers (register_alloc / move / load /
store) and the control flow that reads them (nl.dynamic_range with register
bounds, nl.fori_loop, nl.while_loop, `while reg:`, .ap(scalar_offset=reg)).
Register values come from data the kernel computes, so every test checks
that the loop ran the data's number of times."""
import numpy as np
import pytest
import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl
from nki_current_helpers import *  # noqa: F401,F403


def k_dynamic_range_register(x, count):
    """bwmm's hybrid loop: a trip count loaded into a register, nl.dynamic_range(start, reg)."""
    c = load(count)
    reg = nisa.register_alloc()
    nisa.register_load(reg, c)
    acc = nl.ndarray((P, x.shape[1]), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    t = load(x)
    for _ in nl.dynamic_range(0, reg):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    return store(acc)


@pytest.mark.parametrize("target", V3)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_dynamic_range_with_a_register_trip_count(target, count):
    x = ints_as_f32((P, 8), -5, 5, 252)
    got = run(k_dynamic_range_register, target, x, np.array([[count]], np.int32))
    assert np.array_equal(got, count * x)


def k_count_from_device_data(flags, x):
    """The trip count is computed on the chip (a sum of 0/1 flags), then loaded into a register."""
    f = load(flags)
    n = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=n, op=nl.add, data=f, axis=1)
    reg = nisa.register_alloc(0)
    nisa.register_load(dst=reg, src=n)
    acc = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=1.0)
    t = load(x)

    def body(i):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.multiply)

    nl.fori_loop(0, reg, body)
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.register_store(out, reg)
    return store(acc), store(out)


@pytest.mark.parametrize("target", V3)
def test_fori_loop_over_a_count_computed_on_the_chip(target):
    flags = np.array([[1, 0, 1, 1, 0, 1, 0, 0]], np.float32)
    x = np.full((P, 4), 2.0, np.float32)
    acc, n = run(k_count_from_device_data, target, flags, x)
    assert int(n[0, 0]) == 4 and np.array_equal(acc, np.full((P, 4), 16.0, np.float32))


def k_while_register(blocks, lengths):
    """`while reg:` over blocks until a zero length: each iteration reads the next length with
    scalar_offset=register, as dynamic flash attention walks its KV blocks."""
    nb, F = blocks.shape
    lens = load(lengths)
    acc = nl.ndarray((1, F), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    cond = nisa.register_alloc()
    nisa.register_load(cond, lens[0:1, 0:1])
    idx = nisa.register_alloc(0)
    visited = 0
    while cond:
        row = nl.ndarray((1, F), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=blocks.ap([[F, 1], [1, F]], offset=0, scalar_offset=idx, indirect_dim=0))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        visited += 1
        nisa.register_move(idx, visited)
        nisa.register_load(cond, lens[0:1, visited:visited + 1])
    return store(acc)


@pytest.mark.parametrize("target", V3)
def test_while_on_a_register_reads_its_condition_each_iteration(target):
    blocks = normal((6, 32), 260)
    lengths = np.array([[5, 7, 2, 0, 9, 9, 0]], np.int32)  # three blocks before the zero
    got = run(k_while_register, target, blocks, lengths)
    np.testing.assert_allclose(got[0], blocks[:3].sum(axis=0), rtol=1e-6)


def k_while_loop(x, steps):
    """nl.while_loop: the body returns the next condition register (a countdown in SBUF)."""
    left = load(steps)
    acc = load(x)
    one = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=one, value=1)
    r = nisa.register_alloc()
    nisa.register_load(r, left)

    def body(cond):
        nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)
        nisa.tensor_tensor(dst=left, data1=left, data2=one, op=nl.subtract)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, left)
        return nxt

    nl.while_loop(r, body)
    return store(acc)


@pytest.mark.parametrize("target", V3)
def test_while_loop_runs_until_its_register_is_zero(target):
    x = ints_as_f32((P, 8), -4, 4, 261)
    assert np.array_equal(run(k_while_loop, target, x, np.array([[5]], np.int32)), x + 5)
    assert np.array_equal(run(k_while_loop, target, x, np.array([[0]], np.int32)), x)


def test_register_loads_need_data():
    """A timing-only run has no data to resolve a register with: a clear error."""
    kernel = nki.benchmark(k_dynamic_range_register)
    with pytest.raises(NotImplementedError, match="register loaded from kernel data in a timing-only run"):
        kernel(nki.spec((P, 8), nl.float32), nki.spec((1, 1), nl.int32))


def test_register_moves_and_python_arithmetic():
    r = nisa.register_alloc(3)
    nisa.register_move(r, 7)
    copy = nisa.register_alloc(r)
    assert int(copy) == 7 and copy + 1 == 8 and 2 * copy == 14 and copy == 7 and not nisa.register_alloc()
    assert list(nl.dynamic_range(copy)) == list(range(7))


def k_scalar_arithmetic(index, table):
    """nisa.scalar_load: a value read from data, arithmetic on it, a dynamic row offset, scalar_store."""
    i = nisa.scalar_load(load(index))
    j = i * 2 + 1
    row = nl.ndarray((1, table.shape[1]), table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=table.ap([[table.shape[1], 1], [1, table.shape[1]]], offset=0, scalar_offset=j,
                                        indirect_dim=0))
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(out, j)
    return store(row), store(out)


@pytest.mark.parametrize("target", V3)
def test_scalar_load_arithmetic_and_offsets(target):
    table = normal((12, 16), 262)
    row, j = run(k_scalar_arithmetic, target, np.array([[4]], np.int32), table)
    assert int(j[0, 0]) == 9 and np.array_equal(row[0], table[9])
