#!/usr/bin/env bash
# Installs everything tern needs to build and test (Debian packages only,
# via apt-get), then configures and builds. Idempotent: safe to run again;
# packages already present are not reinstalled and the build is incremental.
#
# Usage: bash scripts/setup.sh            # release build in build/
#        TERN_PRESET=asan bash scripts/setup.sh   # Debug + ASan/UBSan in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang-format       # the style test
  dpkg-dev           # cpack -G DEB (dpkg-shlibdeps)
  libfmt-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libhwy-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev    # the baseline of the simulator's matmul benchmark
  zlib1g-dev         # checkpoint checksums (CRC-32)
  libpng-dev         # the loss-curve plot of tern train
  libicu-dev         # GPT-2 BPE pre-tokenizer (Unicode letter and digit classes)
  libmpfr-dev        # test oracle for the number formats
  python3            # /usr/bin/python3: JSON checks in the CLI tests
  python3-jsonschema # trace schema check
  python3-dev pybind11-dev python3-numpy python3-pytest  # the tern Python package and its tests
  python3-torch      # the independent oracle of the kernel and training tests
  libopenmpi-dev openmpi-bin  # ranks of a multi-chip simulation (mpirun)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

preset=${TERN_PRESET:-default}
cmake --preset "$preset" >/dev/null
# Two jobs: the machines tern is developed and tested on have two cores.
cmake --build --preset "$preset" -j "${TERN_JOBS:-2}"
echo "setup: built preset '$preset'"
