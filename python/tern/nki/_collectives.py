"""Running nki.collectives between a multi-rank kernel's parts: the calls
recorded while tracing (collectives.py) move the ranks' HBM values through a
runtime System (tern._core.System), which reduces in FP32 in rank order and
times each collective on the fabric. Collectives launch asynchronously: a
rank's next parts run while one is in flight, and a rank waits for it
before the first part that touches its tensors (or at the kernel's end)."""
import numpy as np


def check_same(want, got, rank):
    """Every rank makes the same collective calls in the same order."""
    if len(got) != len(want):
        raise ValueError(f"rank {rank} makes {len(got)} collective calls but rank 0 makes {len(want)}: "
                         "every rank must make the same calls in the same order")
    for k, (a, b) in enumerate(zip(want, got)):
        same = (a["op"], a["groups"], a["reduce"], a["pairs"]) == (b["op"], b["groups"], b["reduce"], b["pairs"])
        shapes = [(s["shape"], s["dtype"], d["shape"]) for s, d in a["operands"]]
        if not same or shapes != [(s["shape"], s["dtype"], d["shape"]) for s, d in b["operands"]]:
            raise ValueError(f"collective {k}: rank {rank} calls {b['where']} but rank 0 calls "
                             f"{a['where']} (op, group, shapes and dtypes must match)")


class InFlight:
    """One launched collective: its System handle, the ranks that have not
    waited for it yet, the tensors it reads or writes, and where each
    member's destination values are (rank -> [(tensor, System buffer)])."""

    def __init__(self, handle, members, names, reads):
        self.handle, self.members, self.names, self.reads = handle, set(members), set(names), reads

    def settle(self, system, rank, updates):
        """Rank waits for it; its destination values go to updates[rank]."""
        system.wait(self.handle, rank)
        for tensor, buf in self.reads.get(rank, []):
            updates[rank][tensor] = system.read(rank, buf)
        self.members.discard(rank)


def launch(system, rec, k, value):
    """Launches collective `rec` (the k-th) on `system`; `value(rank, operand)`
    gives a rank's source values. Returns the InFlight collectives."""
    out = []
    op, groups = rec["op"], rec["groups"]
    for i, (src, dst) in enumerate(rec["operands"]):
        tag = f"collective{k}.{i}"
        names = {src["name"], dst["name"]}
        if op == "collective_permute":
            for j, (a, b) in enumerate(rec["pairs"]):
                system.write(a, f"{tag}.{j}.send", value(a, src), src["dtype"])
                h = system.send_recv(a, f"{tag}.{j}.send", b, f"{tag}.{j}.recv", async_=True)
                out.append(InFlight(h, {a, b}, names, {b: [(dst["name"], f"{tag}.{j}.recv")]}))
            continue
        members = [r for g in groups for r in g]
        src_buf, dst_buf = f"{tag}.in", f"{tag}.out"
        for r in members:
            system.write(r, src_buf, value(r, src), src["dtype"])
        if op == "all_reduce":
            h = system.all_reduce(src_buf, groups, rec["reduce"], async_=True)
            dst_buf = src_buf
        elif op == "all_gather":
            h = system.all_gather(src_buf, dst_buf, groups, async_=True)
        elif op == "reduce_scatter":
            h = system.reduce_scatter(src_buf, dst_buf, groups, rec["reduce"], async_=True)
        elif op == "all_to_all":
            h = system.all_to_all(src_buf, dst_buf, groups, async_=True)
        else:
            raise RuntimeError(f"internal: unknown collective {op}")
        out.append(InFlight(h, members, names, {r: [(dst["name"], dst_buf)] for r in members}))
    return out


def zeros(operand):
    """Timing only: sizes matter, values do not."""
    return np.zeros(operand["elements"], dtype=np.float32)
