#!/usr/bin/env bash
# End-to-end checks of the `tern` CLI: the acceptance answers of issue 2,
# --help everywhere, and one-line errors with a non-zero exit for bad input.
# Usage: cli_test.sh path/to/tern path/to/data
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

# run CMD...: captures stdout/stderr/exit code of one tern call.
run() {
  "$TERN" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
}

# expect_ok "pattern" CMD...: exit 0 and stdout matches the extended regex.
expect_ok() {
  local pat=$1
  shift
  run "$@"
  if [ $rc -ne 0 ]; then bad "tern $* exited $rc: $(cat "$tmp/err")"; return; fi
  if grep -Eq -- "$pat" "$tmp/out"; then ok; else bad "tern $*: output lacks /$pat/:"; cat "$tmp/out"; fi
}

# expect_err "text" CMD...: non-zero exit, exactly one stderr line, containing text.
expect_err() {
  local text=$1
  shift
  run "$@"
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ $rc -eq 0 ]; then bad "tern $* succeeded but should fail"; return; fi
  if [ "$lines" -ne 1 ]; then bad "tern $*: $lines stderr lines (want 1):"; cat "$tmp/err"; return; fi
  if grep -Fq -- "$text" "$tmp/err"; then ok; else bad "tern $*: stderr lacks '$text': $(cat "$tmp/err")"; fi
}

# expect_json 'python expression on j' CMD...: the JSON output satisfies it.
expect_json() {
  local expr=$1
  shift
  run "$@"
  if [ $rc -ne 0 ]; then bad "tern $* exited $rc: $(cat "$tmp/err")"; return; fi
  if "$PY" -c "import json,sys; j=json.load(open('$tmp/out')); sys.exit(0 if ($expr) else 1)"; then
    ok
  else
    bad "tern $*: JSON fails: $expr"
  fi
}

# --help everywhere
for cmd in "" info num "num decode" "num encode" "num mx" "num formats"; do
  # shellcheck disable=SC2086
  expect_ok "Usage|Options" $cmd --help
done

# Acceptance 2: tern info --arch trn3 --json
expect_json 'j["cores"] == 8' info --arch trn3 --json
expect_json 'j["sbuf"]["bytes_per_core"] == 32 * 2**20' info --arch trn3 --json
expect_json 'j["psum"]["bytes_per_core"] == 2 * 2**20' info --arch trn3 --json
expect_json 'abs(j["tensor_peak"]["mxfp8"]["per_chip_tflops"] / 2517 - 1) < 0.01' info --arch trn3 --json
expect_json 'j["hbm"]["bytes"] == 144 * 2**30' info --arch trn3 --json
expect_ok "SBUF / core +32 MiB" info
expect_ok "mxfp8 +4x +314.6 TFLOPS +2516.6 TFLOPS" info --arch trn3
expect_ok "^system +trn3-ultraserver-gen2" info --list
expect_json 'len(j["chips"]) == 3 and len(j["systems"]) == 5' info --list --json
expect_json 'j["chips"] == 144 and abs(j["tensor_peak_pflops"]["mxfp8"] / 362 - 1) < 0.01' info --system trn3-ultraserver-gen2 --json
expect_ok "torus2d 4x4" info --system trn2-ultraserver

# Acceptance 3: numerics.md worked examples through tern num
expect_ok "^e4m3 0x7e = 448 " num decode e4m3 0x7e
expect_json 'j["value"] == 448 and j["class"] == "normal"' num decode e4m3 126 --json
expect_json 'j["value"] == "nan"' num decode e4m3 0xff --json
expect_json 'j["value"] == "inf"' num decode e5m2 0b01111100 --json
expect_json 'j["value"] == 2.0**-127' num decode e8m0 0x00 --json
expect_json 'j["value"] == 288 and j["code_hex"] == "0x79"' num encode e4m3 300.5 --json
expect_json 'j["value"] == 448' num encode e4m3 464 --json
expect_json 'j["value"] == "nan" and j["status"] == "overflow"' num encode e4m3 464.001 --json
expect_json 'j["value"] == 448' num encode e4m3 1e6 --sat --json
expect_json 'j["value"] == "inf"' num encode e5m2 61440 --json
expect_json 'j["value"] == 57344' num encode e5m2 61439 --json
expect_json 'j["value"] == 6' num encode e2m1 100 --json
expect_json 'j["value"] in (288, 320)' num encode e4m3 300.5 --round sr --seed 1 --json
expect_json 'j["value"] == 240' num encode e4m3-legacy 240 --json
expect_json 'j["value"] == "inf"' num encode e4m3-legacy 250 --json
# MX: amax 485 -> ocp-floor X=1 (448); rceil X=2 (240); trn3 X=2 (240); amax 300 -> trn3 X=2 (144)
expect_json 'j["blocks"][0]["scale"] == 1 and j["blocks"][0]["elements"][0]["element"] == 448' num mx --format mxfp8-e4m3 --policy ocp-floor 485 --json
expect_json 'j["blocks"][0]["scale"] == 2 and j["blocks"][0]["elements"][0]["element"] == 240' num mx --format mxfp8-e4m3 --policy rceil 485 --json
expect_json 'j["blocks"][0]["scale"] == 2 and j["blocks"][0]["elements"][0]["element"] == 240' num mx --format mxfp8-e4m3 --policy trn3 485 --json
expect_json 'j["blocks"][0]["scale"] == 1 and j["blocks"][0]["elements"][0]["element"] == 288' num mx --format mxfp8-e4m3 --policy rceil 300 --json
expect_json 'j["blocks"][0]["scale"] == 2 and j["blocks"][0]["elements"][0]["element"] == 144' num mx --format mxfp8-e4m3 --policy trn3 300 --json
expect_json 'j["blocks"][0]["scale_code"] == 0' num mx --format mxfp4 --policy rceil 0 0 --json
expect_json 'j["blocks"][0]["scale_code"] == 255' num mx --format mxfp8-e5m2 --policy rceil 1 nan --json
expect_json 'len(j["blocks"]) == 2' num mx --format mxfp4 $(seq 1 33) --json
expect_ok "^e4m3 " num formats
expect_json 'any(f["name"] == "e2m1" and f["max_finite"] == 6 for f in j)' num formats --json
expect_ok "cfp8-e4m3-b10" num encode cfp8-e4m3-b10 1.5

# Acceptance 4: every bad input exits non-zero with a one-line reason
expect_err "unknown number format 'e9m9'" num decode e9m9 0x7e
expect_err "unknown number format 'fp7'" num encode fp7 1.0
expect_err "malformed number '3.x'" num encode e4m3 3.x
expect_err "malformed number ''" num encode e4m3 ""
expect_err "malformed code '0xzz'" num decode e4m3 0xzz
expect_err "malformed code '-1'" num decode e4m3 -1
expect_err "does not fit e2m1" num decode e2m1 0x10
expect_err "unknown rounding 'up'" num encode e4m3 1 --round up
expect_err "unknown MX format 'mxfp9'" num mx --format mxfp9 1
expect_err "unknown MX scale policy 'ceil'" num mx --policy ceil 1
expect_err "not supported: the trn3 scale policy for mxfp6-e3m2" num mx --format mxfp6-e3m2 --policy trn3 1
expect_err "malformed number 'abc'" num mx 1 abc
expect_err "malformed cfp8 format" num encode cfp8-e4 1
expect_err "unknown chip 'trn9'" info --arch trn9
expect_err "unknown system 'trn9-pod'" info --system trn9-pod
expect_err "error" bogus-command
expect_err "error" num
expect_err "error" info --arch
# Broken hardware files, made from the real one.
sed 's/^cores = 8 /cores = "eight" /' "$DATA/arch/trn3.toml" >"$tmp/wrongtype.toml"
expect_err "key 'chip.cores': expected an integer in [1, 4096], got string \"eight\"" info --arch "$tmp/wrongtype.toml"
grep -v '^capacity_gib' "$DATA/arch/trn3.toml" >"$tmp/missing.toml"
expect_err "key 'hbm.capacity_gib'" info --arch "$tmp/missing.toml"
sed 's/^partition_kib = 256/partition_kib = 0/' "$DATA/arch/trn3.toml" >"$tmp/impossible.toml"
expect_err "key 'sbuf.partition_kib': expected an integer in [1," info --arch "$tmp/impossible.toml"
printf '[chip\nname = 1\n' >"$tmp/syntax.toml"
expect_err "TOML syntax error" info --arch "$tmp/syntax.toml"
expect_err "no such hardware description file" info --arch "$tmp/absent.toml"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
