"""Running nki.collectives between a multi-rank kernel's parts: the calls
recorded while tracing (collectives.py) move the ranks' HBM values through a
runtime System (tern._core.System), which reduces in FP32 in rank order and
times each collective on the fabric."""
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


def _values(sim, operand):
    if sim is None:  # timing only: sizes matter, values do not
        return np.zeros(operand["elements"], dtype=np.float32)
    return sim.read(operand["name"])


def run(system, rec, k, ranks, sims):
    """Runs collective `rec` (the k-th) on `system`; returns, per rank, the
    new values of its destination tensors (name -> float32 array)."""
    out = {}
    op, groups = rec["op"], rec["groups"]
    for i, (src, dst) in enumerate(rec["operands"]):
        tag = f"collective{k}.{i}"
        if op == "collective_permute":
            for j, (a, b) in enumerate(rec["pairs"]):
                system.write(a, f"{tag}.{j}.send", _values(sims[a], src), src["dtype"])
                system.send_recv(a, f"{tag}.{j}.send", b, f"{tag}.{j}.recv")
                out.setdefault(b, {})[dst["name"]] = system.read(b, f"{tag}.{j}.recv")
            continue
        members = [r for g in groups for r in g]
        src_buf, dst_buf = f"{tag}.in", f"{tag}.out"
        for r in members:
            system.write(r, src_buf, _values(sims[r], src), src["dtype"])
        if op == "all_reduce":
            system.all_reduce(src_buf, groups, rec["reduce"])
            dst_buf = src_buf
        elif op == "all_gather":
            system.all_gather(src_buf, dst_buf, groups)
        elif op == "reduce_scatter":
            system.reduce_scatter(src_buf, dst_buf, groups, rec["reduce"])
        elif op == "all_to_all":
            system.all_to_all(src_buf, dst_buf, groups)
        else:
            raise RuntimeError(f"internal: unknown collective {op}")
        for r in members:
            out.setdefault(r, {})[dst["name"]] = system.read(r, dst_buf)
    return out
