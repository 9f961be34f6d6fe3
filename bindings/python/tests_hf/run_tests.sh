#!/bin/sh
# ctest driver of the hf_* and kvpress_* tests:
#   run_tests.sh VENV PACKAGE_DIR SHARED_DIR PYTEST_ARGS...
# VENV (hf, kvpress) is one of scripts/setup-python.sh's venvs, found in its
# default place ($KVCACHE_VENV_DIR, else $XDG_CACHE_HOME/kvcache/venv, else
# ~/.cache/kvcache/venv); a missing venv reports the test skipped (77).
venv=$1
pkg=$2
shared=$3
shift 3
root=${KVCACHE_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/venv}
py=$root/$venv/bin/python
if [ ! -x "$py" ]; then
  echo "skipped: $py is missing (bash scripts/setup-python.sh creates it)"
  exit 77
fi
cd "$(dirname "$0")" || exit 1
PYTHONPATH=$pkg KVCACHE_SHARED_DIR=$shared exec "$py" -m pytest -q -p no:cacheprovider -rs "$@"
