#!/bin/sh
# ctest python_wheel: `python -m build bindings/python` (the sdist, then the
# wheel built from the unpacked sdist) on a copy of the source tree without
# .git (the files git tracks or would track, as in a release archive), then
# the wheel installed into another fresh virtual environment, where kvcache
# must import from site-packages and run (a pool, append, gather).
# Usage: wheel_test.sh PYTHON WORK_DIR    (exit 77: skipped)
set -eu
python=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work/tree"

# The copy: git's view of the work tree where there is one (tracked and
# untracked-but-not-ignored files, as they are on disk), else the whole tree
# but its build folders.
if git -C "$root" rev-parse --show-toplevel > /dev/null 2>&1 \
   && [ "$(cd "$(git -C "$root" rev-parse --show-toplevel)" && pwd)" = "$root" ]; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard) | \
    "$python" -c '
import os, shutil, sys
root, dst = sys.argv[1:]
for name in sys.stdin.buffer.read().decode().split("\0"):
    path = os.path.join(root, name)
    if name and os.path.isfile(path):  # not a deleted file or a submodule
        os.makedirs(os.path.dirname(os.path.join(dst, name)), exist_ok=True)
        shutil.copy2(path, os.path.join(dst, name))
' "$root" "$work/tree"
else
  (cd "$root" && tar -cf - --exclude='./build*' --exclude='./_*' --exclude='./.venv*' --exclude='./.cache' \
      --exclude='./bindings/rust/target' --exclude='./bindings/python/build' .) | (cd "$work/tree" && tar -xf -)
fi
[ ! -e "$work/tree/.git" ] || { echo "FAILED: the copy has a .git"; exit 1; }

"$python" -m venv "$work/build-venv"
bpy=$work/build-venv/bin/python
if ! "$bpy" -m pip install -q build > "$work/pip-build.log" 2>&1; then
  echo "skipped: pip cannot install 'build' from its index:"
  tail -n 3 "$work/pip-build.log"
  exit 77
fi
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export CMAKE_BUILD_PARALLEL_LEVEL
unset LD_LIBRARY_PATH PKG_CONFIG_PATH
start=$(date +%s)
if ! "$bpy" -m build --outdir "$work/dist" "$work/tree/bindings/python" > "$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log"
  echo "FAILED: python -m build (whole log: $work/build.log)"
  exit 1
fi
echo "python -m build (sdist, then the wheel from it): $(( $(date +%s) - start )) s"
ls "$work/dist"

# The sdist carries the library's sources; the wheel only the package.
"$bpy" - "$work/dist" <<'PY'
import glob, sys, tarfile, zipfile
dist = sys.argv[1]
(sdist,) = glob.glob(dist + "/kvcache-*.tar.gz")
(wheel,) = glob.glob(dist + "/kvcache-*.whl")
top = sdist.rsplit("/", 1)[1][:-len(".tar.gz")]
names = tarfile.open(sdist).getnames()
for need in ("pyproject.toml", "PKG-INFO", "kvcache/__init__.py", "libkvcache/CMakeLists.txt",
             "libkvcache/include/kvcache/kvcache.h", "libkvcache/src/CMakeLists.txt",
             "libkvcache/src/kvcache.map", "libkvcache/cuda/stub.cpp", "libkvcache/bindings/swig/kvcache_common.i",
             "libkvcache/bindings/swig/common/pool.i",
             "libkvcache/bindings/swig/python/kvcache_python.i", "libkvcache/bindings/swig/python/CMakeLists.txt"):
    assert top + "/" + need in names, (need, sdist)
assert not any("/.git/" in n or "__pycache__" in n for n in names), sdist
files = sorted(zipfile.ZipFile(wheel).namelist())
print("wheel:", wheel.rsplit("/", 1)[1])
print("\n".join("  " + f for f in files))
pkg = [f for f in files if not f.startswith("kvcache-")]
assert all(f.startswith("kvcache/") for f in pkg), pkg
for need in ("kvcache/__init__.py", "kvcache/native.py", "kvcache/_version.py", "kvcache/libkvcache.so.0"):
    assert need in pkg, (need, pkg)
assert [f for f in pkg if f.startswith("kvcache/_native.") and f.endswith(".so")], pkg
PY

"$python" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install -q --no-index --no-cache-dir "$work"/dist/kvcache-*.whl
cd "$work"
"$py" - <<'PY'
import os, sysconfig
import numpy as np
import kvcache
pkg = os.path.dirname(os.path.abspath(kvcache.__file__))
assert pkg == os.path.join(os.path.realpath(sysconfig.get_paths()["platlib"]), "kvcache"), pkg
assert kvcache.__version__ == kvcache.version(), (kvcache.__version__, kvcache.version())
cfg = kvcache.PoolConfig()
cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 4, 2, 64
cfg.num_blocks = 16
with kvcache.Pool(cfg) as pool:
    pool.seq_create(1)
    pool.reserve(1, 5)
    k = np.arange(5 * 2 * 64, dtype=np.float32).reshape(5, 2, 64) / 64
    pool.append(1, 0, 0, k, -k)
    k2, v2 = pool.gather(1, 0)
    assert np.array_equal(k2, k) and np.array_equal(v2, -k)
print("wheel installed:", pkg, "version", kvcache.__version__, "- pool, append, gather: ok")
PY
