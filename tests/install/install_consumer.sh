#!/bin/sh
# core_install_consumer: install the current build into a scratch prefix,
# then build and run a small C program against the installed library twice:
# with `pkg-config --cflags --libs kvcache` and with CMake's
# find_package(kvcache) + kvcache::kvcache (and kvcache::kvcache_static).
# Usage: install_consumer.sh BUILD_DIR WORK_DIR CONSUMER_SRC_DIR C_COMPILER GENERATOR VERSION [EXTRA_FLAGS]
set -eu
build=$1
work=$2
src=$3
cc=$4
gen=$5
expect_version=$6
extra=${7:-}
prefix="$work/prefix"
rm -rf "$work"
mkdir -p "$work"

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/kvcache/kvcache.h; do
  [ -f "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
pc=$(find "$prefix" -name kvcache.pc | head -n 1)
cfg=$(find "$prefix" -name kvcacheConfig.cmake | head -n 1)
[ -n "$pc" ] || { echo "kvcache.pc not installed" >&2; exit 1; }
[ -n "$cfg" ] || { echo "kvcacheConfig.cmake not installed" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
for f in libkvcache.so libkvcache.so.0 libkvcache.a; do
  [ -e "$libdir/$f" ] || { echo "not installed: $libdir/$f" >&2; exit 1; }
done
soname=$(readelf -d "$libdir/libkvcache.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "libkvcache.so.0" ] || { echo "SONAME is '$soname', expected libkvcache.so.0" >&2; exit 1; }

echo "== pkg-config"
if command -v pkg-config >/dev/null 2>&1; then
  flags=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --libs kvcache)
  echo "pkg-config --cflags --libs kvcache: $flags"
  # shellcheck disable=SC2086
  "$cc" -std=c99 -Wall -Wextra -Werror $extra "$src/consumer.c" -o "$work/consumer_pc" $flags
  LD_LIBRARY_PATH="$libdir" "$work/consumer_pc"
  version=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --modversion kvcache)
  echo "pkg-config --modversion kvcache: $version"
  [ "$version" = "$expect_version" ] || { echo "kvcache.pc version $version, library $expect_version" >&2; exit 1; }
  # Static linking from C with the flags pkg-config gives (--static adds Libs.private).
  sflags=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --static --cflags --libs kvcache)
  # shellcheck disable=SC2086
  "$cc" -std=c99 $extra "$src/consumer.c" -o "$work/consumer_pc_static" \
    $(echo "$sflags" | sed "s|-lkvcache|$libdir/libkvcache.a|")
  "$work/consumer_pc_static"
else
  echo "pkg-config not installed: that half is not run" >&2
  exit 1
fi

echo "== find_package(kvcache)"
cmake -S "$src" -B "$work/cmake-build" -G "$gen" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$prefix" -DKVC_CONSUMER_STATIC=ON -DKVC_EXPECT_VERSION="$expect_version" \
  -DCMAKE_C_FLAGS="$extra" -DCMAKE_CXX_FLAGS="$extra" > "$work/consumer-configure.log" ||
  { cat "$work/consumer-configure.log"; exit 1; }
cmake --build "$work/cmake-build" > "$work/consumer-build.log" ||
  { cat "$work/consumer-build.log"; exit 1; }
# The build tree's RPATH points at the installed library: no LD_LIBRARY_PATH.
"$work/cmake-build/consumer_shared"
"$work/cmake-build/consumer_static"
echo "installed package works with pkg-config and find_package"
