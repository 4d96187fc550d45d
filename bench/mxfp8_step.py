#!/usr/bin/python3
"""What MXFP8 buys on the simulated trn3: the GPT-2 small and the
Llama-3-8B-shaped 2-layer training steps (`tern compile ... --train
--estimate`, one chip, 8 cores a kernel) in BF16 and MXFP8 under the trn3
and rceil scale policies, each MX recipe fused (every operand quantized
once per step, the default) and unfused (`--mx-unfused`: quantized inside
every matmul), with the step time, its ratio to BF16, the share of
quantize and transpose kernels, the fusion rate and the model FLOPs as a
share of the chip's peak, against the targets the MXFP8 work aims for.

Model FLOPs per step: 6 x (matmul parameters) x tokens + 12 x layers x
dim x seq x tokens (the attention score and value products, forward and
backward; Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters", appendix). Matmul parameters are all
parameters but the input embedding table (GPT-2's tied table counts once,
as the LM head) and GPT-2's position table.

Usage: /usr/bin/python3 bench/mxfp8_step.py [--tern build/tern] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    "gpt2": {"flags": ["--model", "gpt2", "--batch", "4"],
             "layers": 12, "dim": 768, "seq": 1024, "tokens": 4096, "vocab": 50304},
    "llama": {"flags": ["--model", "llama", "--layers", "2", "--dim", "4096", "--ffn", "14336",
                        "--heads", "32", "--kv-heads", "8", "--seq", "4096", "--batch", "1"],
              "layers": 2, "dim": 4096, "seq": 4096, "tokens": 4096, "vocab": 50304},
}

RECIPES = [
    ("bf16", ["--autocast", "bf16"], "bf16"),
    ("mxfp8 trn3", ["--autocast", "mxfp8", "--mx-policy", "trn3"], "mxfp8"),
    ("mxfp8 trn3 unfused", ["--autocast", "mxfp8", "--mx-policy", "trn3", "--mx-unfused"], "mxfp8"),
    ("mxfp8 rceil", ["--autocast", "mxfp8", "--mx-policy", "rceil"], "mxfp8"),
    ("mxfp8 rceil unfused", ["--autocast", "mxfp8", "--mx-policy", "rceil", "--mx-unfused"],
     "mxfp8"),
]

QUANTIZE = {"mx_quantize", "fp8_scale"}


def run_json(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def model_flops(m, params):
    embed = m["vocab"] * m["dim"]
    matmul_params = params - (m["seq"] * m["dim"] if m["flags"][1] == "gpt2" else embed)
    return 6 * matmul_params * m["tokens"] + 12 * m["layers"] * m["dim"] * m["seq"] * m["tokens"]


def measure(tern, model, flags, peak_tflops):
    m = MODELS[model]
    out = run_json([tern, "compile", *m["flags"], "--train", "--estimate", "--json",
                    "--no-progress", *flags])
    est = out["estimate"]
    by_kernel = {}
    for group in est["kernels"]:
        for launch in group["launches"]:
            by_kernel[launch["kernel"]] = by_kernel.get(launch["kernel"], 0.0) + launch["ns"]
    total = est["total_ns"]
    quant = sum(ns for k, ns in by_kernel.items() if k in QUANTIZE)
    trans = sum(ns for k, ns in by_kernel.items() if "transpose" in k)
    flops = model_flops(m, out["params"])
    return {"step_ms": total / 1e6, "quantize_share": quant / total,
            "transpose_share": trans / total, "fusion_rate": out["fusion_rate"],
            "not_lowered": len(est["not_lowered"]),
            "peak_share": flops / (total * 1e-9) / (peak_tflops * 1e12),
            "top": sorted(((k, ns / 1e6) for k, ns in by_kernel.items()), key=lambda kv: -kv[1])[:4]}


def targets(model, rows):
    """(what, value, target, met) for the model's goals."""
    bf16 = rows["bf16"]["step_ms"]
    out = []
    if model == "gpt2":
        for name, limit in (("mxfp8 trn3", 0.6), ("mxfp8 rceil", 0.7)):
            r = rows[name]["step_ms"] / bf16
            out.append((f"{name} step / bf16 step", f"{r:.3f}", f"<= {limit}", r <= limit))
        for name in ("mxfp8 trn3", "mxfp8 rceil"):
            s = rows[name]["quantize_share"] + rows[name]["transpose_share"]
            out.append((f"{name} quantize + transpose share", f"{s:.1%}", "<= 12 %", s <= 0.12))
        f = rows["bf16"]["fusion_rate"]
        out.append(("fusion rate", f"{f:.3f}", ">= 0.85", f >= 0.85))
    else:
        r = rows["mxfp8 trn3"]["step_ms"] / bf16
        out.append(("mxfp8 trn3 step / bf16 step", f"{r:.3f}", "<= 0.5", r <= 0.5))
        p = rows["mxfp8 trn3"]["peak_share"]
        out.append(("mxfp8 trn3 model FLOPs / MXFP8 peak", f"{p:.1%}", ">= 50 %", p >= 0.5))
        p = rows["bf16"]["peak_share"]
        out.append(("bf16 model FLOPs / BF16 peak", f"{p:.1%}", ">= 75 %", p >= 0.75))
        f = rows["bf16"]["fusion_rate"]
        out.append(("fusion rate", f"{f:.3f}", ">= 0.8", f >= 0.8))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tern", default=os.path.join(HERE, "..", "build", "tern"))
    ap.add_argument("--json", action="store_true", help="print the measurements as JSON")
    a = ap.parse_args()
    info = run_json([a.tern, "info", "--arch", "trn3", "--json"])["tensor_peak"]
    result = {}
    for model in MODELS:
        rows = {}
        for name, flags, peak in RECIPES:
            print(f"{model}: {name}", file=sys.stderr, flush=True)
            rows[name] = measure(a.tern, model, flags, info[peak]["per_chip_tflops"])
        result[model] = {"rows": rows, "targets": targets(model, rows)}
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    for model, res in result.items():
        rows = res["rows"]
        bf16 = rows["bf16"]["step_ms"]
        print(f"\n### {model}: `tern compile {' '.join(MODELS[model]['flags'])} --train --estimate`\n")
        print("| recipe | step | vs bf16 | quantize | transpose | fusion rate | "
              "model FLOPs / peak | largest kernels (ms) |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, r in rows.items():
            top = ", ".join(f"{k} {ms:.2f}" for k, ms in r["top"])
            missing = f" ({r['not_lowered']} not lowered)" if r["not_lowered"] else ""
            print(f"| {name} | {r['step_ms']:.2f} ms{missing} | {r['step_ms'] / bf16:.3f} | "
                  f"{r['quantize_share']:.1%} | {r['transpose_share']:.1%} | "
                  f"{r['fusion_rate']:.3f} | {r['peak_share']:.1%} | {top} |")
        print("\n| goal | measured | target | met |")
        print("|---|---:|---:|---|")
        for what, value, target, met in res["targets"]:
            print(f"| {what} | {value} | {target} | {'yes' if met else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
