#!/bin/sh
# arch_clang_format: every C, C++ and CUDA source of src/, cuda/, tools/ and include/ is
# formatted as the repository's .clang-format says (clang-format --dry-run --Werror).
#
#   sh tests/arch/clang_format.sh          check: names each file clang-format would change
#   sh tests/arch/clang_format.sh --fix    reformat all of them in place (clang-format -i)
#
# The formatting depends on clang-format's version: the tree is kept formatted with
# clang-format 14 (Debian's clang-format-14), which this script prefers. Environment:
# CLANG_FORMAT (the program to run). tests/ is not checked (fixtures, generated cases).
# Exit status: 0 all formatted (or --fix done); 1 some file would change; 77 no clang-format.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
fix=0
[ "${1:-}" = "--fix" ] && fix=1

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then cf=$(command -v "$c"); break; fi
  done
fi
if [ -z "$cf" ]; then
  echo "arch_clang_format: skipped: clang-format not found (set CLANG_FORMAT)"
  exit 77
fi
# Another major version formats some constructs differently: only 14 checks (or fixes).
major=$("$cf" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p' | head -n 1)
if [ "$major" != 14 ]; then
  echo "arch_clang_format: skipped: $("$cf" --version | head -n 1) is not version 14 (the tree is formatted with 14)"
  exit 77
fi

cd "$root" || exit 1
list=$(find src cuda tools include -type d \( -name 'build*' -o -name '.*' \) -prune -o \
         -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cxx' -o -name '*.h' \
         -o -name '*.hh' -o -name '*.hpp' -o -name '*.inc' -o -name '*.cu' -o -name '*.cuh' \) \
         -print 2>/dev/null | LC_ALL=C sort)

if [ $fix -eq 1 ]; then
  # shellcheck disable=SC2086  # the paths have no blanks
  "$cf" -i --style=file $list || exit 1
  echo "arch_clang_format: reformatted $(echo "$list" | wc -l) files with $("$cf" --version)"
  exit 0
fi

total=0
bad=0
for f in $list; do
  total=$((total + 1))
  if ! out=$("$cf" --dry-run --Werror --style=file "$f" 2>&1); then
    bad=$((bad + 1))
    echo "$f: not formatted ($(printf '%s\n' "$out" | grep -c 'error:') places differ)"
  fi
done
if [ $bad -ne 0 ]; then
  echo "arch_clang_format: $bad of $total files are not formatted as .clang-format says" \
       "($("$cf" --version)); reformat them all with: sh tests/arch/clang_format.sh --fix"
  exit 1
fi
echo "arch_clang_format: OK ($total files, $("$cf" --version))"
