#!/usr/bin/python3
"""Regenerates bench/RESULTS.md: the kernel library's targets on
simulated trn3, measured by `tern bench kernel` (timing mode) in one run.

Usage: /usr/bin/python3 bench/results.py [--tern build/tern] [--out bench/RESULTS.md]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

# (kernel, options, metric, target %, what the target is). metric "tensor":
# useful FLOPs as % of the Tensor-engine peak of the kernel's dtype; "hbm":
# % of HBM bandwidth. Memory-bound rows use tensors of >= 64 MiB.
ROWS = [
    ("matmul", "--m 4096 --n 4096 --k 4096 --dtype bf16 --out bf16 --cores 8", "tensor", 85,
     "bf16 matmul 4096^3"),
    ("matmul", "--m 4096 --n 4096 --k 4096 --dtype fp8_e4m3_x4 --out bf16 --mx-prequantized --cores 8",
     "tensor", 75, "mxfp8 matmul 4096^3, MX operands in HBM"),
    ("matmul", "--m 4096 --n 4096 --k 4096 --dtype fp4_e2m1_x4 --out bf16 --mx-prequantized --cores 8",
     "tensor", None, "mxfp4 matmul 4096^3, MX operands in HBM (no target)"),
    ("matmul", "--m 4096 --n 4096 --k 4096 --dtype fp8_e4m3_x4 --out bf16 --cores 8", "tensor", None,
     "mxfp8 matmul 4096^3, BF16 operands quantized on chip (for reference)"),
    ("flash_attention", "--seq 4096 --head-dim 128 --causal true", "tensor", 50,
     "flash attention fwd, seq 4096, hd 128, causal (unmasked FLOPs)"),
    ("flash_attention_backward", "--seq 4096 --head-dim 128 --causal true", "tensor", 40,
     "flash attention bwd, same shape"),
    ("rmsnorm", "--rows 8192 --dim 4096 --cores 8", "hbm", 70, "RMSNorm fwd, 64 MiB bf16"),
    ("rmsnorm", "--rows 16384 --dim 4096 --cores 8", "hbm", 70, "RMSNorm fwd, 128 MiB bf16"),
    ("rmsnorm_backward", "--rows 8192 --dim 4096 --cores 8", "hbm", 70, "RMSNorm bwd, 64 MiB bf16"),
    ("layernorm", "--rows 8192 --dim 4096 --cores 8", "hbm", 70, "LayerNorm fwd, 64 MiB bf16"),
    ("layernorm_backward", "--rows 16384 --dim 2048 --cores 8", "hbm", 70,
     "LayerNorm bwd, 64 MiB bf16"),
    ("softmax", "--rows 8192 --dim 4096 --cores 8", "hbm", 70, "softmax fwd, 64 MiB bf16"),
    ("softmax_backward", "--rows 8192 --dim 4096 --cores 8", "hbm", 70,
     "softmax bwd, 64 MiB bf16"),
    ("softmax_backward", "--rows 16384 --dim 4096 --cores 8", "hbm", 70,
     "softmax bwd, 128 MiB bf16"),
    ("adamw", "--rows 4096 --dim 4096 --cores 8", "hbm", 70,
     "AdamW, 16.8M params (64 MiB fp32 each of p, m, v)"),
    ("cross_entropy", "--rows 8192 --vocab 50304 --cores 8", "hbm", None,
     "cross-entropy fwd+bwd, 8192 tokens x 50304 (no target)"),
    ("glu", "--rows 8192 --dim 4096 --cores 8", "hbm", None, "SwiGLU fwd (no target)"),
    ("glu_backward", "--rows 8192 --dim 4096 --cores 8", "hbm", None, "SwiGLU bwd (no target)"),
    ("elementwise", "--rows 8192 --dim 4096 --cores 8", "hbm", None, "add (no target)"),
    ("reduce", "--rows 16384 --dim 4096 --op sumsq --all --cores 8", "hbm", None,
     "sum of squares (grad norm) (no target)"),
    ("clip_by_global_norm", "--rows 4096 --dim 4096 --cores 8", "hbm", None,
     "clip by global norm (no target)"),
    ("cast", "--rows 16384 --dim 4096 --cores 8", "hbm", None,
     "bf16 -> fp8 scaled + amax (no target)"),
    ("mx_quantize", "--k 16384 --dim 4096 --cores 8", "hbm", None, "MXFP8 quantize, QuantizeMX (no target)"),
    ("mx_quantize", "--k 16384 --dim 4096 --policy rceil --cores 8", "hbm", None,
     "MXFP8 quantize, rceil scales, ALU ops (no target)"),
    ("mx_quantize", "--k 16384 --dim 4096 --elem fp4_e2m1_x4 --policy rceil --cores 8", "hbm", None,
     "MXFP4 quantize, rceil scales, ALU ops (no target)"),
    ("mx_dequantize", "--k 16384 --dim 4096 --cores 8", "hbm", None,
     "MXFP8 dequantize to bf16 (no target)"),
    ("embedding", "--tokens 16384 --vocab 50304 --dim 768 --cores 8", "hbm", None,
     "embedding gather (no target)"),
    ("embedding_backward", "--tokens 16384 --vocab 50304 --dim 768 --cores 8", "hbm", None,
     "embedding scatter-add (no target)"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tern", default="build/tern")
    ap.add_argument("--out", default="bench/RESULTS.md")
    a = ap.parse_args()
    lines = []
    met = missed = 0
    for i, (kernel, opts, metric, target, what) in enumerate(ROWS):
        cmd = [a.tern, "bench", "kernel", kernel, *opts.split(), "--mode", "timing", "--json"]
        print(f"[{i + 1}/{len(ROWS)}] {' '.join(cmd[1:])}", file=sys.stderr)
        j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        value = (j["useful"] or {}).get("peak_percent", 0.0) if metric == "tensor" else j["hbm_peak_percent"]
        busy = j["engine_busy_percent"][0]
        busy_s = " / ".join(f"{busy.get(e, 0):.0f}" for e in ("tensor", "vector", "scalar", "gpsimd"))
        verdict = ""
        if target is not None:
            ok = value >= target
            met += ok
            missed += not ok
            verdict = "met" if ok else "**missed**"
        unit = "% of Tensor peak" if metric == "tensor" else "% of HBM BW"
        lines.append(
            f"| {what} | `tern bench kernel {kernel} {opts}` | {j['latency_ns'] / 1e3:.1f} | "
            f"{value:.1f} {unit} | {'' if target is None else f'>= {target} %'} | {verdict} | {busy_s} |")
    head = f"""# Kernel library results (simulated trn3)

Generated by `/usr/bin/python3 bench/results.py` on {datetime.date.today()} from
`tern bench kernel NAME ... --mode timing --json` (8 NeuronCores of one
trn3 chip unless the kernel's defaults say otherwise; flash attention's
defaults: batch 1, 8 heads, 8 cores). Percentages: useful FLOPs over the
Tensor-engine peak of the kernel's dtype, or HBM bytes over the chip's
4.9 TB/s. Engine busy: core 0, Tensor / Vector / Scalar / GpSimd %.
Kernel-library targets: {met} met, {missed} missed (the reasons for each miss
are in the section below the table).

| kernel | command | latency (us) | result | target | | busy T/V/S/G % |
|---|---|---:|---:|---:|---|---|
"""
    tail = open(os.path.join(os.path.dirname(__file__), "results_notes.md")).read()
    with open(a.out + ".tmp", "w") as f:
        f.write(head + "\n".join(lines) + "\n\n" + tail)
    os.replace(a.out + ".tmp", a.out)
    print(f"wrote {a.out}: {met} targets met, {missed} missed", file=sys.stderr)


if __name__ == "__main__":
    main()
