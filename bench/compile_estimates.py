#!/usr/bin/python3
"""The simulated GPT-2-small training step under each precision recipe,
the numbers docs/graph.md quotes: `tern compile --model gpt2 --batch 4
--train --estimate` (trn3, 8 cores a kernel) per recipe, with the step
time and the kernels that take longest.

Usage: /usr/bin/python3 bench/compile_estimates.py [--tern build/tern] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

RECIPES = [
    ("bf16", ["--autocast", "bf16"]),
    ("mxfp8 (trn3 scales)", ["--autocast", "mxfp8", "--mx-policy", "trn3"]),
    ("mxfp8 (rceil, default)", ["--autocast", "mxfp8"]),
    ("fp8-hybrid, delayed", ["--autocast", "fp8-hybrid", "--fp8-scaling", "delayed"]),
    ("fp8-hybrid, current", ["--autocast", "fp8-hybrid"]),
    ("mxfp4", ["--autocast", "mxfp4"]),
]


def estimate(tern, flags):
    cmd = [tern, "compile", "--model", "gpt2", "--batch", "4", "--train", "--estimate", "--json"]
    out = subprocess.run(cmd + flags, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tern", default=os.path.join(HERE, "..", "build", "tern"))
    ap.add_argument("--json", action="store_true", help="print the estimates as JSON")
    a = ap.parse_args()
    rows = []
    for name, flags in RECIPES:
        est = estimate(a.tern, flags)["estimate"]
        by_kernel = {}
        for group in est["kernels"]:
            for launch in group["launches"]:
                by_kernel[launch["kernel"]] = by_kernel.get(launch["kernel"], 0.0) + launch["ns"]
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:4]
        rows.append({"recipe": name, "step_ms": est["total_ns"] / 1e6,
                     "not_lowered": len(est["not_lowered"]),
                     "top": [(k, ns / 1e6) for k, ns in top]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| precision | step | largest kernels |")
    print("|---|---:|---|")
    for r in rows:
        top = ", ".join(f"{k} {ms:.1f}" for k, ms in r["top"])
        missing = f" ({r['not_lowered']} not lowered)" if r["not_lowered"] else ""
        print(f"| {r['recipe']} | {r['step_ms']:.1f} ms{missing} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
