#!/bin/sh
# ctest python_pip_prereqs: what pip cannot install stops the build with one
# line naming the Debian packages. Configures pip's build (the options of
# bindings/python/pyproject.toml) with OpenSSL hidden, with xxHash's header
# hidden, and with no compiler, and looks for that line in CMake's output.
# Usage: prereqs_test.sh CMAKE WORK_DIR
set -eu
cmake=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
check() {  # NAME PACKAGE CMAKE_ARGS...
  name=$1
  pkg=$2
  shift 2
  if "$cmake" -S "$root" -B "$work/$name" -DKVC_PYTHON_PACKAGE=ON -DKVC_BUILD_TOOLS=OFF -DKVC_BUILD_TESTS=OFF \
       -DKVC_BUILD_BENCH=OFF -DKVC_CUDA=OFF "$@" > "$work/$name.log" 2>&1; then
    cat "$work/$name.log"
    echo "FAILED: the configure without $name succeeded"
    exit 1
  fi
  line=$(grep -E "^ +libkvcache needs .*: apt-get install .*$pkg" "$work/$name.log" || true)
  if [ -z "$line" ] || [ "$(printf '%s\n' "$line" | wc -l)" -ne 1 ]; then
    cat "$work/$name.log"
    echo "FAILED: no one line naming $pkg"
    exit 1
  fi
  echo "without $name:$line"
}
check openssl libssl-dev -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON
check xxhash libxxhash-dev -DXXHASH_INCLUDE_DIR="$work/no-such-folder"
(CC=$work/no-such-cc CXX=$work/no-such-c++ && export CC CXX && check compiler build-essential) || exit 1
