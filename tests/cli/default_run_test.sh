#!/usr/bin/env bash
# The recorded default run cannot drift from the code: a fresh `tern train`
# (the README's main job, its built-in default) is stopped after step 100,
# and its losses, gradient norms, learning rates and simulated step times
# must equal those of docs/train/default-mxfp8.csv (what
# bench/readme_numbers.py recorded) to the last digit.
# Usage: default_run_test.sh TERN SOURCE_DIR
set -euo pipefail
tern=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# kill@100: the process stops itself after step 100's validation.
"$tern" train --metrics run.csv --inject kill@100 >/dev/null 2>&1 || true
/usr/bin/python3 - "$src/docs/train/default-mxfp8.csv" run.csv <<'PY'
import csv, sys
cols = ["step", "loss", "val_loss", "grad_norm", "lr", "sim_ns"]
def rows(path):
    return [tuple(r[c] for c in cols) for r in csv.DictReader(open(path)) if int(r["step"]) <= 100]
want, got = rows(sys.argv[1]), rows(sys.argv[2])
if len(got) < 101:
    sys.exit(f"FAIL: the fresh run stopped after {len(got)} rows (want 101)")
for w, g in zip(want, got):
    if w != g:
        sys.exit(f"FAIL: recorded {dict(zip(cols, w))}\n      fresh    {dict(zip(cols, g))}\n"
                 "docs/train/default-*.csv are stale: rerun bench/readme_numbers.py")
print(f"the fresh run's first 100 steps equal the recording ({len(got)} rows)")
PY
