#!/bin/sh
# ctest python_pip_install: `pip install bindings/python` into a fresh virtual
# environment, as a user does it: pip builds libkvcache and the SWIG module
# from this source tree (scikit-build-core + CMake, the build requirements
# from pip's index in an isolated environment; no pkg-config, no installed
# library). Then, from another folder and without LD_LIBRARY_PATH: kvcache is
# the environment's (site-packages), its extension _native and libkvcache lie
# in the package's folder (RUNPATH $ORIGIN), kvcache.__version__ is the
# library's, and the Python tests pass on it.
# Usage: pip_install_test.sh PYTHON WORK_DIR    (exit 77: skipped)
set -eu
python=$1
work=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
# numpy and pytest come from the interpreter the project's setup installed them
# into (the tests' CMake checked that it has them).
"$python" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
# pip's isolated build fetches scikit-build-core and swig: skip where pip's
# index cannot be reached.
if ! "$py" -m pip download -q --no-deps -d "$work/probe" "scikit-build-core>=1.0" > "$work/probe.log" 2>&1; then
  echo "skipped: pip cannot fetch the build requirements (scikit-build-core) from its index:"
  tail -n 3 "$work/probe.log"
  exit 77
fi
# One build of the library at a time beside others: 2 jobs unless told.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export CMAKE_BUILD_PARALLEL_LEVEL
unset LD_LIBRARY_PATH PKG_CONFIG_PATH
start=$(date +%s)
if ! "$py" -m pip install -v --no-cache-dir "$src" > "$work/pip.log" 2>&1; then
  tail -n 60 "$work/pip.log"
  echo "FAILED: pip install $src (whole log: $work/pip.log)"
  exit 1
fi
echo "pip install (library + module build): $(( $(date +%s) - start )) s"

cd "$work"  # away from the source tree: `import kvcache` must find the installed package
"$py" - <<'PY'
import os, sysconfig
import kvcache
from kvcache import _native, native
pkg = os.path.dirname(os.path.abspath(kvcache.__file__))
want = os.path.join(os.path.realpath(sysconfig.get_paths()["platlib"]), "kvcache")
assert os.path.realpath(pkg) == want and "site-packages" in pkg, (pkg, want)
assert os.path.dirname(os.path.abspath(_native.__file__)) == pkg, _native.__file__
libs = {line.split(None, 5)[-1].strip() for line in open("/proc/self/maps") if "libkvcache." in line}
assert libs and all(os.path.dirname(p) == os.path.realpath(pkg) for p in libs), libs
assert kvcache.__version__ == native.version(), (kvcache.__version__, native.version())
print("installed:", pkg, "version", kvcache.__version__)
print("files:", " ".join(sorted(f for f in os.listdir(pkg) if f != "__pycache__")))
print("library loaded:", " ".join(sorted(libs)))
PY
pkg=$("$py" -c "import kvcache, os; print(os.path.dirname(kvcache.__file__))")
if command -v readelf > /dev/null 2>&1; then
  runpath=$(readelf -d "$pkg"/_native*.so | grep -E 'R(UN)?PATH' || true)
  echo "_native: $runpath"
  case $runpath in
    *"[\$ORIGIN]"*) ;;
    *) echo "FAILED: _native's RUNPATH is not \$ORIGIN"; exit 1 ;;
  esac
fi
exec "$py" -m pytest -q -p no:cacheprovider "$src/tests"
