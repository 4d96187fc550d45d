#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds the .deb, then runs
# both from another working directory with a clean environment: the binary
# and the Python module must find their data beside themselves, never in
# the source tree.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# A clean environment: no PYTHONPATH, no TERN_DATA_DIR, no build tree.
clean() { env -i PATH=/usr/bin:/bin HOME="$work/home" LANG=C.UTF-8 "$@"; }
mkdir -p "$work/home" "$work/elsewhere"

check_prefix() {  # PREFIX LABEL: tern info, 3 training steps and an NKI kernel from elsewhere
  local prefix=$1 label=$2 site="$1/lib/python3/dist-packages"
  cd "$work/elsewhere"
  clean "$prefix/bin/tern" info >info.txt || fail "$label: tern info"
  grep -q "$prefix/share/tern/data/arch/trn3.toml" info.txt ||
    fail "$label: tern info read its chip from elsewhere: $(head -1 info.txt)"
  clean "$prefix/bin/tern" train --steps 3 --no-progress >train.txt 2>&1 ||
    fail "$label: tern train --steps 3: $(tail -3 train.txt)"
  grep -q "over 3 steps" train.txt || fail "$label: no training summary"
  cp "$src/examples/nki/tensor_add.py" kernel.py
  clean PYTHONPATH="$site" /usr/bin/python3 -c \
    "import tern; assert tern.__file__.startswith('$site'), tern.__file__; import tern._core as c; print(c.data_dir())" \
    >data_dir.txt || fail "$label: import tern"
  [ "$(cat data_dir.txt)" = "$prefix/share/tern/data" ] ||
    fail "$label: the Python module reads $(cat data_dir.txt)"
  clean PYTHONPATH="$site" /usr/bin/python3 kernel.py >kernel.txt 2>&1 ||
    fail "$label: NKI kernel: $(tail -3 kernel.txt)"
  echo "$label: ok ($(tail -1 kernel.txt))"
}

# 1. cmake --install into a prefix.
cmake --install "$build" --prefix "$work/prefix" >/dev/null
check_prefix "$work/prefix" "cmake --install"

# 2. The .deb, unpacked into a root of its own (what dpkg -i would write
#    under /), with the dependencies dpkg-shlibdeps found.
cpack -G DEB -B "$work/deb" --config "$build/CPackConfig.cmake" >"$work/cpack.log" 2>&1 ||
  fail "cpack: $(tail -5 "$work/cpack.log")"
deb=$(ls "$work"/deb/tern_*.deb)
dpkg-deb -f "$deb" Depends >"$work/depends.txt"
for p in libfmt9 libtomlplusplus3 libicu72 python3-numpy; do
  grep -q "$p" "$work/depends.txt" || fail ".deb does not depend on $p: $(cat "$work/depends.txt")"
done
dpkg-deb -x "$deb" "$work/root"
check_prefix "$work/root/usr" ".deb"
echo "Depends: $(cat "$work/depends.txt")"
