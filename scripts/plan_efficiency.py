#!/usr/bin/python3
"""Regenerate data/plan/efficiency/<chip>.toml: the planner's per-operation
efficiency tables for Trainium chips, measured on tern's own simulator.

Each entry is one `tern bench` run in timing mode on all of the chip's
cores: GEMMs over a grid of shapes and dtypes (efficiency = achieved FLOP/s
over the dtype's peak), FlashAttention forward and backward (FLOPs over the
BF16 peak), the LayerNorm forward and backward pair (achieved HBM bytes/s
over the HBM peak) and the
latency of the smallest elementwise kernel (its fixed cost). Shapes a
kernel does not support are left out; the planner takes the nearest shape.

Usage: /usr/bin/python3 scripts/plan_efficiency.py [--tern build/tern] [--chips trn3 ...]
       [--keep-gemms]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SIZES = [1024, 4096, 16384]
DTYPES = {"trn3": ["bf16", "fp8_e4m3", "mxfp8"], "trn2": ["bf16", "fp8_e4m3_legacy"],
          "trn1": ["bf16"]}
CORES = {"trn3": 8, "trn2": 8, "trn1": 2}
TABLE_DTYPE = {"bf16": "bf16", "fp8_e4m3": "fp8", "fp8_e4m3_legacy": "fp8", "mxfp8": "mxfp8"}


def bench(tern, args):
    r = subprocess.run([tern, "bench"] + args + ["--mode", "timing", "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), None


def kept_gemms(path):
    """The [[gemm]] entries and the skipped-shape comments of an existing table."""
    text = open(path).read()
    at = text.index("[[gemm]]")
    skipped = [l[len("#   "):] for l in text[:at].splitlines() if l.startswith("#   ")]
    return text[at:].rstrip("\n").split("\n\n"), skipped


def chip_table(tern, chip, keep=None):
    cores = CORES[chip]
    lines = []
    skipped = []
    if keep:
        lines, skipped = kept_gemms(keep)
        lines = [l + "\n" for l in lines]
    for dtype in [] if keep else DTYPES[chip]:
        for m in SIZES:
            for k in SIZES:
                for n in SIZES:
                    j, err = bench(tern, ["matmul", "--arch", chip, "--m", str(m), "--k", str(k),
                                          "--n", str(n), "--dtype", dtype, "--cores", str(cores)])
                    if j is None:
                        skipped.append(f"{dtype} {m}x{k}x{n}: {err.splitlines()[-1]}")
                        continue
                    eff = j["peak_percent"] / 100
                    lines.append(f'[[gemm]]\ndtype = "{TABLE_DTYPE[dtype]}"\nm = {m}\nk = {k}\n'
                                 f'n = {n}\nefficiency = {eff:.4f}   # {j["latency_us"]:.1f} us\n')
                    print(f"  {chip} {dtype} {m}x{k}x{n}: {eff:.3f}", file=sys.stderr)
    head = {}
    # The bandwidth-bound kernels: a training step runs each forward and
    # backward, so the LayerNorm pair over one shape (16384 x 2048 bf16, a
    # row the backward's PSUM accumulators hold on every chip): both
    # kernels' HBM bytes over both latencies.
    pair = []
    for kernel in ("layernorm", "layernorm_backward"):
        ln, err = bench(tern, ["kernel", kernel, "--arch", chip, "--rows", "16384", "--dim", "2048",
                               "--cores", str(cores)])
        if ln is None:
            sys.exit(f"{kernel} bench failed on {chip}: {err}")
        pair.append(ln)
    peak_gbps = pair[0]["hbm_gbps"] / (pair[0]["hbm_peak_percent"] / 100)
    pair_gbps = sum(j["hbm_bytes"] for j in pair) / sum(j["latency_ns"] for j in pair)
    head["memory_efficiency"] = (pair_gbps / peak_gbps, "LayerNorm forward + backward, 16384 x 2048 "
                                 "bf16: both kernels' HBM bytes / both latencies / peak", 4)
    # The fixed cost of a bandwidth-bound kernel: an add of one 128 x 128
    # BF16 tile per core (two loads, one Vector op, one store), where the
    # bytes take a small part of the time.
    el, err = bench(tern, ["kernel", "elementwise", "--arch", chip, "--rows", str(128 * cores),
                           "--dim", "128", "--cores", str(cores)])
    if el is None:
        sys.exit(f"elementwise bench failed on {chip}: {err}")
    head["kernel_latency_ns"] = (el["latency_ns"], "elementwise add, one 128 x 128 bf16 tile "
                                 "per core: a kernel's fixed cost", 1)
    for key, kernel in (("attention_efficiency", "flash_attention"),
                        ("attention_backward_efficiency", "flash_attention_backward")):
        fa, err = bench(tern, ["kernel", kernel, "--arch", chip, "--batch", "1", "--q-heads", "8",
                               "--seq", "4096", "--head-dim", "128", "--causal", "false",
                               "--cores", str(cores)])
        if fa is None:
            print(f"  {chip}: no {kernel} ({err.splitlines()[-1]})", file=sys.stderr)
            continue
        # The kernel counts its useful FLOPs (QK^T and PV forward; the
        # backward's five GEMMs) against the chip's BF16 peak.
        eff = fa["useful"]["peak_percent"] / 100
        head[key] = (eff, f"{kernel} b=1 h=8 s=4096 d=128 non-causal bf16", 4)
    out = [f"# Generated by scripts/plan_efficiency.py from `tern bench ... --mode timing` on",
           f"# all {cores} cores of {chip}; do not edit by hand. The planner takes the",
           f"# nearest GEMM shape (log-distance over m, k, n) of the dtype.",
           "schema = 1", f'chip = "{chip}"']
    for k, (v, why, digits) in head.items():
        out.append(f"{k} = {v:.{digits}f}   # {why}")
    if skipped:
        out.append("# Not supported by the kernel, left out:")
        out += [f"#   {s}" for s in skipped]
    return "\n".join(out) + "\n\n" + "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tern", default="build/tern")
    ap.add_argument("--chips", nargs="*", default=["trn3", "trn2", "trn1"])
    ap.add_argument("--out", default="data/plan/efficiency")
    ap.add_argument("--keep-gemms", action="store_true",
                    help="re-measure the header only; keep the table's GEMM entries (the GEMM "
                    "grid takes 10-30 minutes a chip)")
    a = ap.parse_args()
    for chip in a.chips:
        path = os.path.join(a.out, f"{chip}.toml")
        text = chip_table(a.tern, chip, path if a.keep_gemms else None)
        fd, tmp = tempfile.mkstemp(dir=a.out)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
