#!/bin/sh
# abi_exported_symbols: the exact list of dynamic symbols libkvcache.so
# defines (type letter, name@@version) must equal tests/abi/exported_symbols.txt.
# Usage: check_symbols.sh LIBRARY EXPECTED_LIST [--update]
set -eu
lib=$1
expected=$2
command -v nm >/dev/null 2>&1 || { echo "nm not found: skipped"; exit 77; }
actual=$(nm -D --defined-only "$lib" | awk '{ print $(NF-1), $NF }' | LC_ALL=C sort)
if [ "${3:-}" = "--update" ]; then
  printf '%s\n' "$actual" > "$expected"
  echo "wrote $expected"
  exit 0
fi
if printf '%s\n' "$actual" | diff -u "$expected" -; then
  echo "exported symbols match $(basename "$expected") ($(printf '%s\n' "$actual" | wc -l) symbols)"
else
  echo "exported symbols of $lib differ from $expected (- expected, + actual)." >&2
  echo "Removing or renaming a symbol breaks the ABI (docs/abi-policy.md); after adding one," >&2
  echo "update the list: cmake --build <build> --target abi-symbols" >&2
  exit 1
fi
