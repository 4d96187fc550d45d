#!/usr/bin/python3
"""The flash attention tables of docs/kernels.md: `tern bench kernel
flash_attention` / `flash_attention_backward` (simulated trn3, timing mode,
8 cores) at the shapes the docs list, in bf16 and fp32.

Usage: /usr/bin/python3 bench/flash_numbers.py [--tern build/tern]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [
    ("causal (default)", []),
    ("`--causal 0`", ["--causal", "0"]),
    ("`--head-dim 64`", ["--head-dim", "64"]),
    ("`--q-heads 32 --kv-heads 8 --seq 2048`", ["--q-heads", "32", "--kv-heads", "8", "--seq", "2048"]),
    ("`--seq 24576`", ["--seq", "24576"]),
]
FP32_SHAPES = SHAPES[:3]


def bench(tern, kernel, flags):
    cmd = [tern, "bench", "kernel", kernel, "--json"] + flags
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def latency(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tern", default=os.path.join(HERE, "..", "build", "tern"))
    a = ap.parse_args()
    kernels = [("forward", "flash_attention"), ("backward", "flash_attention_backward")]
    print("| kernel | shape | latency | useful % of BF16 peak | busy on core 0 "
          "(Tensor / Vector / Scalar / GpSimd) |")
    print("|---|---|---:|---:|---|")
    for label, kernel in kernels:
        for name, flags in SHAPES:
            if kernel.endswith("backward") and "--seq" in flags and "24576" in flags:
                continue  # the backward's working set does not fit SBUF there
            j = bench(a.tern, kernel, flags)
            b = j["engine_busy_percent"][0]
            busy = " / ".join(f"{b[e]:.1f}" for e in ("tensor", "vector", "scalar", "gpsimd"))
            print(f"| {label} | {name} | {latency(j['latency_us'])} | "
                  f"{j['useful']['peak_percent']:.1f} % | {busy} % |")
    print()
    print("| kernel (B 1, H 8, S 4096, D 128, 8 cores) | bf16 | fp32 | fp32 / bf16 | fp32 Tensor busy |")
    print("|---|---:|---:|---:|---:|")
    for label, kernel in kernels:
        for name, flags in FP32_SHAPES:
            bf = bench(a.tern, kernel, flags)
            fp = bench(a.tern, kernel, flags + ["--dtype", "fp32"])
            row = f"{label}, {'causal' if not flags else name}"
            print(f"| {row} | {bf['latency_us']:.1f} us | {fp['latency_us']:.1f} us | "
                  f"{fp['latency_us'] / bf['latency_us']:.1f}x | "
                  f"{fp['engine_busy_percent'][0]['tensor']:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
