#!/usr/bin/python3
"""Where a kernel's time goes, read off its simulated trace: per engine of
core 0, the busy time by instruction kind, against the time HBM needs for
the kernel's bytes at the chip's peak bandwidth. Used for the notes on the
missed targets in bench/RESULTS.md.

  /usr/bin/python3 bench/engine_time.py [TERN] -- NAME [kernel options]

prints a markdown table. TERN defaults to build/tern.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

HBM_TBPS = 4.9  # trn3 (data/arch/trn3.toml: hbm.bandwidth); only used for the ratio column


def main(argv):
    tern = "build/tern"
    if "--" in argv:
        i = argv.index("--")
        if i == 1:
            tern = argv[0]
        argv = argv[i + 1 :]
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        out = subprocess.run(
            [tern, "bench", "kernel", *argv, "--mode", "timing", "--json", "--trace", trace],
            check=True, capture_output=True, text=True).stdout
        stats = json.loads(out)
        ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    threads = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    core0 = min(e["pid"] for e in ev if e.get("ph") == "X")
    busy = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in ev:
        if e.get("ph") != "X" or e["pid"] != core0:
            continue
        eng = threads.get((e["pid"], e["tid"]), "?")
        if eng.startswith("dma"):
            continue
        busy[eng][e["name"].split(" ")[0]] += e["dur"]
    lat = stats["latency_us"] if "latency_us" in stats else stats["latency_ns"] / 1000.0
    hbm_us = stats["dma_bytes"] / (HBM_TBPS * 1e12) * 1e6
    print(f"`tern bench kernel {' '.join(argv)}`: latency {lat:.1f} us, "
          f"HBM at peak {hbm_us:.1f} us ({stats['dma_bytes'] / 2**20:.0f} MiB)\n")
    print("| engine (core 0) | busy us | % of latency | by instruction (us) |")
    print("|---|---:|---:|---|")
    for eng in sorted(busy, key=lambda k: -sum(busy[k].values())):
        tot = sum(busy[eng].values())
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(busy[eng].items(), key=lambda kv: -kv[1]))
        print(f"| {eng} | {tot:.1f} | {100 * tot / lat:.0f} | {parts} |")


if __name__ == "__main__":
    main(sys.argv[1:])
