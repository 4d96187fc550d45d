"""nki.collectives for tern: collectives between the ranks of a kernel run
on several simulated chips (docs/nki.md, "Collectives").

A rank is one chip of a system (data/arch/systems); `nki.simulate(kernel,
ranks=N)` traces the kernel once per rank (`rank_id()` is that rank, a
Python int at trace time). Each collective cuts the kernel: the parts
between collectives are programs of their own, run on every rank's chip,
and the collective runs between them on tern's runtime::System. Real values
move (reductions decode to FP32, combine in the group's rank order and
round once to the tensor's dtype) and take the fabric's time for the
group's placement; a collective starts when its last member reaches it and
ends on all members together. Only HBM tensors carry over a collective.

Supported: all_reduce, all_gather, reduce_scatter and all_to_all over a
ReplicaGroup (collective_dim 0), collective_permute; whole HBM tensors of
float32, bfloat16 or float16. Not supported (they say so): SBUF operands,
the implicit ring permutes, all_to_all_v / all_gather_v.
"""
import enum
import math

from tern.nki import _tracer
from tern.nki import language as nl


class rg_partition_op(enum.Enum):
    """How ReplicaGroup.from_partition_op groups ranks: ranks with the same
    op(rank, operand) form one rank list."""
    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


class ReplicaGroup:
    """The ranks a collective runs on, as rank lists: the collective runs
    within each list, all lists at once. A rank is in at most one list;
    ranks in none take no part (their destination is left as it was)."""

    def __init__(self, groups):
        groups = [[int(r) for r in g] for g in groups]
        seen = set()
        for g in groups:
            if not g:
                raise ValueError("ReplicaGroup: an empty rank list")
            for r in g:
                if r < 0 or r in seen:
                    raise ValueError(f"ReplicaGroup {groups}: rank {r} is negative or in two lists")
                seen.add(r)
        self.groups = groups

    @staticmethod
    def from_partition_op(world_size, op, operand):
        f = {rg_partition_op.bitwise_and: lambda r: r & operand,
             rg_partition_op.div: lambda r: r // operand,
             rg_partition_op.mod: lambda r: r % operand}[op]
        lists = {}
        for r in range(int(world_size)):
            lists.setdefault(f(r), []).append(r)
        return ReplicaGroup([lists[k] for k in sorted(lists)])

    def __repr__(self):
        return f"ReplicaGroup({self.groups})"

    def __eq__(self, other):
        return isinstance(other, ReplicaGroup) and self.groups == other.groups


def rank_id():
    """This rank's id (0 .. ranks - 1), a Python int while tracing."""
    return _tracer.current().rank


_REDUCE = {"add": "add", "max": "max", "min": "min"}


def _reduce_name(op):
    name = getattr(op, "alu", None)
    if name not in _REDUCE:
        raise ValueError(f"collective reduction {op!r}: expected nl.add, nl.maximum or nl.minimum")
    return _REDUCE[name]


def _operand(t, what, where):
    """(name, shape, dtype, elements) of a whole HBM tensor."""
    tr = _tracer.current()
    if not isinstance(t, nl.NkiTensor):
        raise TypeError(f"{where}: {what} must be NKI tensors, got {type(t).__name__}")
    if t.buffer in (nl.sbuf, nl.psum):
        raise NotImplementedError(f"not supported: {where} on SBUF/PSUM tensors; tern runs "
                                  "collectives on HBM tensors")
    shape, dtype = tr.hbm_shape(t.name)
    if shape is None or t._p0 != 0 or t._off != 0 or tuple(t.shape) != tuple(shape):
        raise NotImplementedError(f"not supported: {where} on part of an HBM tensor ({t.name} "
                                  f"{tuple(t.shape)}); pass whole tensors")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise NotImplementedError(f"not supported: {where} on {dtype} tensors (float32, bfloat16, "
                                  "float16)")
    return {"name": t.name, "shape": tuple(shape), "dtype": dtype, "elements": math.prod(shape)}


def _pairs(srcs, dsts, where):
    if not isinstance(srcs, (list, tuple)) or not isinstance(dsts, (list, tuple)):
        raise TypeError(f"{where}: srcs and dsts are lists of tensors")
    if len(srcs) != len(dsts) or not srcs:
        raise ValueError(f"{where}: {len(srcs)} srcs and {len(dsts)} dsts; give one dst per src")
    return [(_operand(s, "srcs", where), _operand(d, "dsts", where)) for s, d in zip(srcs, dsts)]


def _groups(replica_group, where):
    if not isinstance(replica_group, ReplicaGroup):
        replica_group = ReplicaGroup(replica_group)
    ranks = _tracer.current().ranks
    for g in replica_group.groups:
        for r in g:
            if r >= ranks:
                raise ValueError(f"{where}: replica group {replica_group.groups} names rank {r}, but "
                                 f"the kernel runs on {ranks} rank(s)")
    return replica_group.groups


def _record(op, srcs, dsts, groups, where, reduce=None, dim=0, pairs=None, size=None):
    if dim != 0:
        raise NotImplementedError(f"not supported: {where} with collective_dim {dim} (0 only, as "
                                  "in NKI)")
    operands = _pairs(srcs, dsts, where)
    for s, d in operands:
        if s["dtype"] != d["dtype"]:
            raise ValueError(f"{where}: src {s['name']} is {s['dtype']} but dst {d['name']} is "
                             f"{d['dtype']}")
        if size is not None:
            size(s, d, groups)
    tr = _tracer.current()
    tr.cut({"op": op, "operands": operands, "groups": groups, "reduce": reduce, "pairs": pairs,
            "where": f"{where} at {_tracer.kernel_location()}"})


def _sizes(factor_dst, factor_src, name):
    def check(s, d, groups):
        for g in groups or [[0]]:
            p = len(g)
            if s["elements"] * (p if factor_dst else 1) != d["elements"] * (p if factor_src else 1):
                raise ValueError(f"{name}: src {s['name']} has {s['elements']} elements and dst "
                                 f"{d['name']} {d['elements']}; over {p} ranks the dst must hold "
                                 + ("p x src" if factor_dst else "src / p" if factor_src else
                                    "as many as the src"))
            if name == "all_to_all" and s["elements"] % p:
                raise ValueError(f"all_to_all: {s['elements']} elements do not split into {p} "
                                 "blocks")
    return check


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """dsts[i] on every member = op over the members' srcs[i] (FP32, rank order)."""
    g = _groups(replica_group, "all_reduce")
    _record("all_reduce", srcs, dsts, g, "all_reduce", _reduce_name(op),
            size=_sizes(False, False, "all_reduce"))


def all_gather(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """dsts[i] = the members' srcs[i] concatenated along dim 0, in rank-list order."""
    g = _groups(replica_group, "all_gather")
    _record("all_gather", srcs, dsts, g, "all_gather", dim=collective_dim,
            size=_sizes(True, False, "all_gather"))


def reduce_scatter(srcs, dsts, replica_group, collective_dim=0, op=nl.add, priority=None, name=None):
    """dsts[i] on the j-th member = block j (dim 0) of op over the members' srcs[i]."""
    g = _groups(replica_group, "reduce_scatter")
    _record("reduce_scatter", srcs, dsts, g, "reduce_scatter", _reduce_name(op), dim=collective_dim,
            size=_sizes(False, True, "reduce_scatter"))


def all_to_all(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """Block j (dim 0) of member i's srcs[k] becomes block i of member j's dsts[k]."""
    g = _groups(replica_group, "all_to_all")
    _record("all_to_all", srcs, dsts, g, "all_to_all", dim=collective_dim,
            size=_sizes(False, False, "all_to_all"))


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """srcs[0] of each pair's source arrives in dsts[0] of its target; ranks that
    are no target keep their dst."""
    if len(srcs) != 1 or len(dsts) != 1:
        raise NotImplementedError("not supported: collective_permute of several tensors (one, as in "
                                  "NKI)")
    ranks = _tracer.current().ranks
    pairs = [(int(a), int(b)) for a, b in source_target_pairs]
    for what, col in (("source", 0), ("target", 1)):
        ids = [p[col] for p in pairs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"collective_permute: a rank is the {what} of two pairs in {pairs}")
    for a, b in pairs:
        if not (0 <= a < ranks and 0 <= b < ranks):
            raise ValueError(f"collective_permute: pair ({a}, {b}) names a rank outside 0..{ranks - 1}")
    _record("collective_permute", srcs, dsts, None, "collective_permute", pairs=pairs,
            size=_sizes(False, False, "collective_permute"))


collective_permute_implicit = _tracer.not_yet("nki.collectives.collective_permute_implicit")
collective_permute_implicit_reduce = _tracer.not_yet("nki.collectives.collective_permute_implicit_reduce")
collective_permute_implicit_current_processing_rank_id = _tracer.not_yet(
    "nki.collectives.collective_permute_implicit_current_processing_rank_id")
all_to_all_v = _tracer.not_yet("nki.collectives.all_to_all_v")
all_gather_v = _tracer.not_yet("nki.collectives.all_gather_v")
