#!/bin/sh
# ctest rust_bindings_current: kvcache-sys/src/bindings.rs must be exactly what
# generate.sh makes from the current include/kvcache/kvcache.h.
# Exit status: 0 current; 1 out of date (a diff is shown); 77 skipped
# (bindgen 0.60.1 or rustfmt missing; generate.sh says which).
set -u
here=$(cd "$(dirname "$0")" && pwd)
checked_in="$here/kvcache-sys/src/bindings.rs"
fresh=$(mktemp "${TMPDIR:-/tmp}/kvc-bindings-check.XXXXXX")
trap 'rm -f "$fresh"' EXIT

sh "$here/generate.sh" "$fresh" >/dev/null
rc=$?
if [ $rc -eq 77 ]; then
  echo "rust_bindings_current: skipped (see above)"
  exit 77
fi
[ $rc -eq 0 ] || exit $rc

if cmp -s "$fresh" "$checked_in"; then
  echo "rust_bindings_current: $checked_in matches the header"
  exit 0
fi
diff -u "$checked_in" "$fresh" | head -n 80
echo "rust_bindings_current: bindings.rs is out of date: run sh bindings/rust/generate.sh and commit it" >&2
exit 1
