"""A kernel over ranks: its parts between collectives on every rank's chip,
the collectives on a runtime System between them."""
from tern import _core
from tern.nki import _collectives
from tern.nki import _kernel


def run(kernel, chip, traced):
    """Every rank's parts on its own chip, the collectives between them on
    a runtime System (docs/nki.md, "Collectives"): launched when the part
    before them ends, waited for by a rank before its first later part
    that touches their tensors, or at the end."""
    ranks = len(traced)
    first = traced[0][0]
    for r, (tr, _, _) in enumerate(traced[1:], 1):
        _collectives.check_same(first.collectives, tr.collectives, r)
    name = kernel.system or _core.smallest_system(chip.name, ranks)
    if name is None:
        raise ValueError(f"no system of {chip.name} chips holds {ranks} ranks; name one with system=")
    system = _core.System(name, ranks)
    data = kernel.mode != "timing"
    carried = [dict() for _ in range(ranks)]  # rank -> tensor name -> raw bytes
    updates = [dict() for _ in range(ranks)]  # rank -> tensor name -> values a collective delivered
    summaries = [[] for _ in range(ranks)]
    sims = [None] * ranks
    in_flight = []

    def settle(r, names=None):
        for c in in_flight:
            if r in c.members and (names is None or c.names & names):
                c.settle(system, r, updates)

    def value(r, operand):
        if not data:
            return _collectives.zeros(operand)
        got = updates[r].get(operand["name"])
        return got if got is not None else sims[r].read(operand["name"])

    parts = len(first.segments)
    for k in range(parts):
        for r, (tr, _, inputs) in enumerate(traced):
            settle(r, tr.touched[k])
            sim = _core.Simulator(chip)
            sim.load(tr.segments[k])
            if data:
                if k == 0:
                    _kernel.write_inputs(sim, inputs)
                for n, b in carried[r].items():
                    sim.write_bytes(n, b)
                for n, v in updates[r].items():
                    sim.write(n, v)
                updates[r] = {}
            summary, _ = sim.run(kernel.mode, False, 0, not kernel.strict_reads)
            summaries[r].append(summary)
            system.advance(r, summary["latency_ns"], f"part {k}")
            if data:
                carried[r] = {d[0]: sim.read_bytes(d[0])
                              for d in tr.hbm_decls[:tr.segment_hbm[k]]}
            sims[r] = sim
        if k + 1 < parts:
            rec = first.collectives[k]
            names = {o["name"] for pair in rec["operands"] for o in pair}
            for r in range(ranks):  # a tensor still in flight is read or rewritten
                settle(r, names)
            in_flight += _collectives.launch(system, rec, k, value)
    for r in range(ranks):
        settle(r)
    clocks = [system.clock(r) for r in range(ranks)]
    kernel.last = {
        "ranks": ranks, "system": name, "parts": parts,
        "latency_ns": max(clocks), "latency_us": max(clocks) / 1e3,
        "rank_latency_ns": clocks,
        "part_latency_ns": [[s["latency_ns"] for s in rs] for rs in summaries],
        "collectives": system.events(),
    }
    if kernel.trace_path:
        system.write_trace(kernel.trace_path)
    if not data:
        return kernel.last
    out = []
    for r, (tr, result, inputs) in enumerate(traced):
        sim = sims[r]
        for n, v in updates[r].items():  # delivered after the last part that ran
            sim.write(n, v)
        if tr.prints:
            print(f"[rank {r}]", end=" ")
        out.append(_kernel.results(sim, tr, result, inputs))
    return out if kernel.ranks is not None else out[0]
