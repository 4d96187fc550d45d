#!/usr/bin/env bash
# Data-parallel training spread over MPI ranks: `mpirun -np 2`
# and `-np 4` run the same dp-4 training as one process, with identical
# losses, norms and validation, also with the optimizer state sharded
# (ZeRO-1), with pipeline stages and with tensor-parallel shards; a checkpoint written under 2 ranks resumes under 4 ranks and in
# one process; a rank's error ends the job (exit 2),
# it never hangs.
# Usage: mpi_test.sh path/to/tern path/to/data
set -u
TERN=$1
DATA=$2
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# Root (CI) must say so; 4 ranks on a 2-core machine oversubscribe.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
base=(train --text "$DATA/tinyshakespeare.txt" --batch 2 --seq 64 --stochastic-rounding
      --eval-every 2 --eval-batches 2 --json)
train=("${base[@]}" --layers 1 --recipe mxfp8)

# The step and validation records, as "step loss grad_norm sim_ns comm_ns" lines.
losses() {
  "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "loss" in j:
        print(j["step"], repr(j["loss"]), repr(j["grad_norm"]), repr(j["sim_ns"]), repr(j["comm_ns"]))
    elif "val_loss" in j:
        print(j["step"], "val", repr(j["val_loss"]))
' "$1"
}

"$TERN" "${train[@]}" --steps 4 --dp 4 >"$tmp/one.jsonl" 2>"$tmp/err" || bad "one process: $(cat "$tmp/err")"
losses "$tmp/one.jsonl" >"$tmp/one.txt"
[ "$(grep -c val "$tmp/one.txt")" -eq 2 ] && [ "$(wc -l <"$tmp/one.txt")" -eq 6 ] && ok || bad "one process wrote: $(cat "$tmp/one.txt")"
for np in 2 4; do
  if timeout 300 "${MPIRUN[@]}" -np $np "$TERN" "${train[@]}" --steps 4 --dp 4 >"$tmp/np$np.jsonl" 2>"$tmp/err"; then
    losses "$tmp/np$np.jsonl" >"$tmp/np$np.txt"
    if cmp -s "$tmp/one.txt" "$tmp/np$np.txt"; then ok; else bad "mpirun -np $np differs:"; diff "$tmp/one.txt" "$tmp/np$np.txt"; fi
  else
    bad "mpirun -np $np failed: $(cat "$tmp/err")"
  fi
done

# ZeRO-1 (the optimizer state sharded over the replicas, each rank holding
# its replicas' shards): the same losses and norms.
if timeout 300 "${MPIRUN[@]}" -np 2 "$TERN" "${train[@]}" --steps 4 --dp 4 --zero 1 >"$tmp/z.jsonl" 2>"$tmp/err"; then
  if cmp -s <(losses "$tmp/one.jsonl" | cut -d' ' -f1-3) <(losses "$tmp/z.jsonl" | cut -d' ' -f1-3); then ok; else bad "zero 1 under 2 ranks differs"; fi
else
  bad "mpirun -np 2 --zero 1 failed: $(cat "$tmp/err")"
fi

# Pipeline and data parallel (dp 2 x pp 2 = 4 chips, 2 layers): the same
# losses, norms, simulated and communication times under 2 ranks.
pp=(--layers 2 --dp 2 --pp 2 --accum 2 --recipe mxfp8)
"$TERN" "${base[@]}" --steps 3 "${pp[@]}" >"$tmp/pp1.jsonl" 2>"$tmp/err" || bad "pp one process: $(cat "$tmp/err")"
if timeout 300 "${MPIRUN[@]}" -np 2 "$TERN" "${base[@]}" --steps 3 "${pp[@]}" >"$tmp/pp2.jsonl" 2>"$tmp/err"; then
  if [ -s "$tmp/pp1.jsonl" ] && cmp -s <(losses "$tmp/pp1.jsonl") <(losses "$tmp/pp2.jsonl"); then ok; else bad "dp 2 x pp 2 under 2 ranks differs"; fi
else
  bad "mpirun -np 2 dp 2 pp 2 failed: $(cat "$tmp/err")"
fi

# Data, tensor and pipeline parallel (dp 2 x tp 2 x pp 2 = 8 chips): the
# same under 2 ranks.
tp=(--layers 2 --dp 2 --tp 2 --pp 2 --accum 2 --recipe bf16)
"$TERN" "${base[@]}" --steps 3 "${tp[@]}" >"$tmp/tp1.jsonl" 2>"$tmp/err" || bad "tp one process: $(cat "$tmp/err")"
if timeout 300 "${MPIRUN[@]}" -np 2 "$TERN" "${base[@]}" --steps 3 "${tp[@]}" >"$tmp/tp2.jsonl" 2>"$tmp/err"; then
  if [ -s "$tmp/tp1.jsonl" ] && cmp -s <(losses "$tmp/tp1.jsonl") <(losses "$tmp/tp2.jsonl"); then ok; else bad "dp 2 x tp 2 x pp 2 under 2 ranks differs"; fi
else
  bad "mpirun -np 2 dp 2 tp 2 failed: $(cat "$tmp/err")"
fi

# Checkpoints: written under 2 ranks at step 2 (sharded optimizer state,
# gathered to the first rank), resumed under 4 ranks and in one process;
# steps 3 and 4 as in the uninterrupted run.
timeout 300 "${MPIRUN[@]}" -np 2 "$TERN" "${train[@]}" --steps 4 --dp 4 --zero 1 --ckpt-dir "$tmp/ck" --ckpt-every 2 \
  --inject kill@2 >/dev/null 2>&1
[ -f "$tmp/ck/step-00000002.ckpt" ] && ok || bad "no checkpoint at step 2: $(ls "$tmp/ck" 2>&1)"
grep -E '^[34] ' "$tmp/one.txt" | grep -v val | cut -d' ' -f1-3 >"$tmp/want.txt"
for how in np4 single; do
  if [ $how = np4 ]; then
    timeout 300 "${MPIRUN[@]}" -np 4 "$TERN" "${train[@]}" --steps 4 --dp 4 --resume "$tmp/ck" >"$tmp/r.jsonl" 2>"$tmp/err"
  else
    "$TERN" "${train[@]}" --steps 4 --dp 4 --resume "$tmp/ck" >"$tmp/r.jsonl" 2>"$tmp/err"
  fi
  losses "$tmp/r.jsonl" | grep -v val | cut -d' ' -f1-3 >"$tmp/got.txt"
  if cmp -s "$tmp/want.txt" "$tmp/got.txt"; then ok; else bad "resume ($how) differs:"; diff "$tmp/want.txt" "$tmp/got.txt"; cat "$tmp/err"; fi
done

# A bad layout: every rank says why, the job ends with exit 2 (no hang).
timeout 120 "${MPIRUN[@]}" -np 4 "$TERN" "${train[@]}" --steps 2 --dp 2 >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "4 processes for dp 2: each process needs at least one replica" "$tmp/err"; then ok; else bad "np 4 dp 2: rc $rc: $(cat "$tmp/err")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
