"""Measures the numbers README.md and docs/train.md quote about the default run.

Runs the README's main job (`tern train`, its built-in default) and the same
run in BF16, each from a scratch folder, and records for each: the wall
time, the median step, the simulated step and the validation losses every
100 steps. Writes the runs' metrics beside docs/train.md (the CSV files the
drift test compares against) and bench/readme_numbers.md (the table, with
the commit it was measured at).

    /usr/bin/python3 bench/readme_numbers.py [--tern build/tern]
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tern, recipe):
    out = os.path.join(ROOT, "docs", "train", f"default-{recipe}.csv")
    png = os.path.join(ROOT, "docs", "train", f"default-{recipe}.png")
    args = [tern, "train", "--metrics", out, "--plot", png]
    if recipe != "mxfp8":
        args += ["--recipe", recipe]
    with tempfile.TemporaryDirectory() as scratch:
        if os.path.exists(out):
            os.remove(out)  # a fresh file, not a resumed one
        t0 = time.monotonic()
        subprocess.run(args, cwd=scratch, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
    rows = list(csv.DictReader(open(out)))
    steps = [r for r in rows if r["wall_ms"]]
    val = {int(r["step"]): float(r["val_loss"]) for r in rows if r["val_loss"]}
    return {
        "recipe": recipe,
        "wall_s": wall,
        "median_step_ms": statistics.median(float(r["wall_ms"]) for r in steps),
        "sim_step_ms": statistics.median(float(r["sim_ns"]) for r in steps) / 1e6,
        "val": val,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default=os.path.join(ROOT, "build", "tern"))
    a = ap.parse_args()
    tern = os.path.abspath(a.tern)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    results = [run(tern, "mxfp8"), run(tern, "bf16")]
    lines = [
        "# The default run, measured",
        "",
        f"Written by `/usr/bin/python3 bench/readme_numbers.py` at commit {commit} on this "
        f"machine ({os.cpu_count()} cores). README.md and docs/train.md quote this table; "
        "tests/cli/default_run_test.sh checks a fresh run's first 100 steps against the "
        "CSV files it wrote (docs/train/default-*.csv).",
        "",
        "| run | val loss at 100 / 300 / 500 / 700 / 900 / 1000 steps | wall time | "
        "median step | simulated step |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        losses = " / ".join(f"{r['val'].get(s, float('nan')):.3f}" for s in
                            (100, 300, 500, 700, 900, 1000))
        m, s = divmod(round(r["wall_s"]), 60)
        lines.append(f"| {r['recipe']}{' (default)' if r['recipe'] == 'mxfp8' else ''} | "
                     f"{losses} | {m}:{s:02d} | {r['median_step_ms']:.0f} ms | "
                     f"{r['sim_step_ms']:.3f} ms |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(ROOT, "bench", "readme_numbers.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
