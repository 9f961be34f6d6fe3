#!/bin/sh
# core_readme_example: the C example in README.md (between the
# "readme-example:begin" and "readme-example:end" marker comments) compiles
# with -std=c99 -Wall -Wextra -Werror against the library and runs.
# Usage: readme_example.sh README INCLUDE_DIR LIBRARY_DIR WORK_DIR C_COMPILER [EXTRA_FLAGS]
set -eu
readme=$1
inc=$2
libdir=$3
work=$4
cc=$5
extra=${6:-}
mkdir -p "$work"
awk '/readme-example:begin/ { on = 1; next }
     /readme-example:end/ { on = 0 }
     on && !/^```/ { print }' "$readme" > "$work/readme_example.c"
if [ ! -s "$work/readme_example.c" ]; then
  echo "no example between the readme-example markers in $readme" >&2
  exit 1
fi
# shellcheck disable=SC2086
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror $extra -I"$inc" "$work/readme_example.c" \
  -o "$work/readme_example" -L"$libdir" -lkvcache -Wl,-rpath,"$libdir"
"$work/readme_example"
echo "README example: compiled and ran"
