#!/bin/sh
# abi_abidiff: compare libkvcache.so with the recorded baseline
# tests/abi/libkvcache.abi (abigail-tools). Added functions are allowed; any
# other change (a removed function, a changed parameter, a struct whose size
# or field offsets changed) fails. Skips (77) without abidiff or without debug
# info (a Release build).
# Usage: abidiff.sh LIBRARY BASELINE HEADERS_DIR [--update]
#   --update regenerates BASELINE from LIBRARY (the `abi-baseline` target).
set -u
lib=$1
baseline=$2
headers=$3
if ! command -v abidiff >/dev/null 2>&1 || ! command -v abidw >/dev/null 2>&1; then
  echo "abidiff/abidw not installed (Debian: abigail-tools): skipped"
  exit 77
fi
if ! readelf -S "$lib" 2>/dev/null | grep -q '\.debug_info'; then
  echo "$lib has no debug info (build RelWithDebInfo or Debug to compare types): skipped"
  exit 77
fi
if [ "${4:-}" = "--update" ]; then
  # Short locations only and no corpus or compilation paths: the file holds
  # no path of the machine that generated it.
  abidw --headers-dir "$headers" --drop-private-types --exported-interfaces-only \
    --short-locs --no-corpus-path --no-comp-dir-path --out-file "$baseline" "$lib" || exit 1
  echo "wrote $baseline"
  exit 0
fi
if [ ! -f "$baseline" ]; then
  echo "no baseline $baseline: run cmake --build <build> --target abi-baseline" >&2
  exit 1
fi
abidiff --no-added-syms --headers-dir2 "$headers" "$baseline" "$lib"
rc=$?
if [ $rc -ne 0 ]; then
  echo "abidiff exit status $rc (4: ABI change, 8: incompatible change, 1/2: error)." >&2
  echo "If the change follows docs/abi-policy.md, record it: cmake --build <build> --target abi-baseline," >&2
  echo "commit tests/abi/libkvcache.abi and note it in CHANGELOG.md." >&2
  exit 1
fi
echo "ABI of $(basename "$lib") matches $(basename "$baseline") (additions allowed)"
