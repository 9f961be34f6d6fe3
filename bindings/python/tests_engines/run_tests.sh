#!/bin/sh
# ctest driver of the engine adapters' contract tests (sglang_*, lmcache_*, vllm_*; docs/engines.md):
#   run_tests.sh PACKAGE_DIR PYTEST_ARGS...
# They run in scripts/setup-python.sh's engines venv (the engines' real
# packages, installed --no-deps), found in its default place
# ($KVCACHE_VENV_DIR, else $XDG_CACHE_HOME/kvcache/venv, else
# ~/.cache/kvcache/venv); a missing venv reports the test skipped (77).
pkg=$1
shift
root=${KVCACHE_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/venv}
py=$root/engines/bin/python
if [ ! -x "$py" ]; then
  echo "skipped: $py is missing (bash scripts/setup-python.sh creates it)"
  exit 77
fi
cd "$(dirname "$0")" || exit 1
PYTHONPATH=$pkg exec "$py" -m pytest -q -p no:cacheprovider -rs "$@"
