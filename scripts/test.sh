#!/usr/bin/env bash
# Runs every test of build/ (scripts/setup.sh builds it), then the fast
# subset under AddressSanitizer + UndefinedBehaviorSanitizer: the number
# formats, programs, the simulator and the built-in kernels, built in
# build-asan/ (Debug; the asan preset). Exit status: non-zero when any test
# of either fails.
#
# Usage: bash scripts/test.sh                 # both
#        TERN_SANITIZE_SUBSET=0 bash scripts/test.sh   # build/ only
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
ctest --test-dir build --output-on-failure -j2 || status=$?
if [[ "${TERN_SANITIZE_SUBSET:-1}" != 0 ]]; then
  echo "== sanitizers (ASan + UBSan), fast subset: num, isa, sim, kernel"
  if cmake --preset asan >/dev/null &&
    cmake --build build-asan -j2 --target test_num test_isa test_sim test_kernel; then
    # Fewer MPFR oracle samples: the sanitized oracle is many times slower.
    TERN_ORACLE_SAMPLES=200000 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest --test-dir build-asan -L '^(num|isa|sim|kernel)$' --output-on-failure -j2 || status=1
  else
    echo "scripts/test.sh: the sanitizer build failed" >&2
    status=1
  fi
fi
exit $status
