#!/usr/bin/env bash
# Every C++ file of the project is clang-formatted with the repo's .clang-format.
# Usage: format_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
bad=$(git ls-files -co --exclude-standard '*.cpp' '*.h' | while read -r f; do
  [ -f "$f" ] && ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1 && echo "$f"
done || true)
if [ -n "$bad" ]; then
  echo "not clang-formatted (run clang-format -i on them):"
  echo "$bad"
  exit 1
fi
echo "all C++ files formatted"
