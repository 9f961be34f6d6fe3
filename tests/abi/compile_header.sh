#!/bin/sh
# abi_header_c99 / abi_header_cxx: compile the public header alone (nothing
# included before it) with each given standard, pedantic, warnings as errors.
# Usage: compile_header.sh COMPILER LANG(c|c++) HEADER STD...
set -eu
cc=$1
lang=$2
header=$3
shift 3
for std in "$@"; do
  echo "$cc -x $lang -std=$std -pedantic -Wall -Wextra -Werror -fsyntax-only $(basename "$header")"
  "$cc" -x "$lang" "-std=$std" -pedantic -Wall -Wextra -Werror -fsyntax-only "$header"
  # Once more as the only include of a translation unit that uses it.
  case $(basename "$header") in
    kvcache_plugin.h) use='KVC_PLUGIN_ABI_VERSION == 0u && sizeof(kvc_plugin_scorer) == 0' ;;
    *) use='kvc_version() == 0u && KVC_OK != 0' ;;
  esac
  printf '#include "%s"\nint main(void) { return %s; }\n' "$header" "$use" |
    "$cc" -x "$lang" "-std=$std" -pedantic -Wall -Wextra -Werror -fsyntax-only -
done
echo "header compiles alone as $lang: $*"
