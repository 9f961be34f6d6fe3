#!/bin/sh
# abi_doxygen (tests/abi) and the `docs` target (CMakeLists.txt): generate the API reference from
# include/kvcache/kvcache.h with docs/Doxyfile (warnings are errors, so an
# undocumented public symbol or parameter fails). Skips (77) without doxygen.
# Usage: doxygen.sh SOURCE_DIR OUTPUT_DIR
set -u
src=$1
out=$2
if ! command -v doxygen >/dev/null 2>&1; then
  echo "doxygen not installed: skipped"
  exit 77
fi
mkdir -p "$out" || exit 1
cd "$src" || exit 1
log="$out/doxygen-warnings.log"
(cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $log") | doxygen - 
rc=$?
if [ -s "$log" ]; then
  cat "$log" >&2
  echo "doxygen: $(grep -c ': \(warning\|error\):' "$log") warning(s) in the public header" >&2
  exit 1
fi
if [ $rc -ne 0 ]; then
  echo "doxygen failed (exit status $rc)" >&2
  exit 1
fi
echo "API reference: $out/html/index.html"
