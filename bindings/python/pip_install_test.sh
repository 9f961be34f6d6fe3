#!/bin/sh
# ctest python_pip_install: pip installs bindings/python (setuptools + swig)
# into a fresh virtual environment against the library of this build, as a
# user would against an installed one, and runs the Python tests on it.
# Usage: pip_install_test.sh PYTHON BUILD_PKGCONFIG_DIR WORK_DIR
set -eu
python=$1
pcdir=$2
work=$3
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
# numpy and pytest come from the interpreter the project's setup installed them into.
"$python" -m venv --system-site-packages "$work/venv"
PKG_CONFIG_PATH=$pcdir "$work/venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --no-cache-dir "$src"
cd "$work"  # away from the source tree: `import kvcache` must find the installed package
"$work/venv/bin/python" - <<'PY'
import kvcache, os
assert "site-packages" in kvcache.__file__, kvcache.__file__
print("installed:", os.path.dirname(kvcache.__file__), "version", kvcache.__version__)
PY
exec "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$src/tests"
