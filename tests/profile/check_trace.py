"""Validates a tern trace against the Chrome trace event schema and checks
that engines overlap in time (usage: check_trace.py SCHEMA TRACE)."""
import json
import sys

import jsonschema

schema = json.load(open(sys.argv[1]))
trace = json.load(open(sys.argv[2]))
jsonschema.validate(trace, schema)

spans = {}
names = {}
for e in trace["traceEvents"]:
    if e["ph"] == "M" and e["name"] == "thread_name":
        names[(e["pid"], e["tid"])] = e["args"]["name"]
    if e["ph"] == "X":
        spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
tracks = {names[k]: v for k, v in spans.items()}
assert "tensor" in tracks, sorted(tracks)
dma = [s for name, v in tracks.items() if name.startswith("dma") for s in v]
assert dma, "no DMA spans"


def overlaps(a, b):
    i = j = 0
    a, b = sorted(a), sorted(b)
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return False


assert overlaps(tracks["tensor"], dma), "the Tensor engine never runs while a DMA is in flight"
evac = tracks.get("vector", []) + tracks.get("scalar", [])
assert overlaps(tracks["tensor"], evac), "PSUM evacuation never overlaps the Tensor engine"
print(f"trace ok: {sum(len(v) for v in spans.values())} spans on {len(tracks)} tracks; engines overlap")
