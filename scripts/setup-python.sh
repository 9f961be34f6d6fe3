#!/usr/bin/env bash
# Creates the Python environments of the transformers (hf_*) and kvpress
# (kvpress_*) tests and of bench/hf_bench.py, outside the repository, once per
# machine; later runs only check them (a few seconds).
#
#   $KVCACHE_VENV_DIR (default: $XDG_CACHE_HOME/kvcache/venv, else ~/.cache/kvcache/venv)
#     torch/    torch (PyPI's build: CUDA-enabled, ~5.6 GB, runs on the CPU), numpy, pytest
#     hf/       newest transformers line + gguf, accelerate, optimum-quanto, hqq,
#               and the package build tools (scikit-build-core, build, cmake, ninja, swig)
#     kvpress/  kvpress with the transformers line it pins (< 5.3), gguf, accelerate
#
# torch is installed once: hf/ and kvpress/ see torch/'s site-packages through a
# .pth file (a venv's --system-site-packages would reach the interpreter's own
# site-packages, not another venv's). Each venv records what it was built from
# in kvc-requirements.txt; a venv whose record differs from this script's pins
# is rebuilt. Exit status 0 when all three work.
set -euo pipefail

root=${KVCACHE_VENV_DIR:-${XDG_CACHE_HOME:-${HOME:-.}/.cache}/kvcache/venv}
python=${PYTHON:-python3}

torch_pins=(torch==2.10.0 numpy==2.3.5 pytest==9.0.2)
hf_pins=(transformers==5.24.0 gguf==0.19.0 accelerate==1.15.0 optimum-quanto==0.2.7 hqq==0.2.8.post1
  scikit-build-core==1.1.2 build==1.6.1 cmake==4.4.5 ninja==1.13.2 swig==4.5.1)
kvpress_pins=(kvpress==0.5.5 transformers==5.2.0 gguf==0.19.0 accelerate==1.15.0)

# make_venv NAME BASE_SITE PINS...: (re)creates $root/NAME unless its record matches.
make_venv() {
  local name=$1 base=$2
  shift 2
  local dir=$root/$name want
  want=$(printf '%s\n' "python=$("$python" -c 'import sys; print(sys.version.split()[0])')" "base=$base" "$@")
  if [ -f "$dir/kvc-requirements.txt" ] && [ "$(cat "$dir/kvc-requirements.txt")" = "$want" ] &&
    "$dir/bin/python" -c 'import sys' 2>/dev/null; then
    echo "setup-python: $name venv present ($dir)"
    return 0
  fi
  echo "setup-python: creating the $name venv in $dir (pip install $*)"
  rm -rf "$dir"
  "$python" -m venv "$dir"
  if [ -n "$base" ]; then
    local site
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$base" > "$site/kvc-torch-venv.pth"
  fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "$@"
  echo "$want" > "$dir/kvc-requirements.txt"
}

mkdir -p "$root"
make_venv torch "" "${torch_pins[@]}"
torch_site=$("$root/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
make_venv hf "$torch_site" "${hf_pins[@]}"
make_venv kvpress "$torch_site" "${kvpress_pins[@]}"

"$root/hf/bin/python" -c 'import torch, transformers, gguf, accelerate; print("setup-python: hf venv: torch", torch.__version__, "transformers", transformers.__version__)'
"$root/kvpress/bin/python" -c 'import importlib.metadata as m, torch, transformers, kvpress; print("setup-python: kvpress venv: torch", torch.__version__, "transformers", transformers.__version__, "kvpress", m.version("kvpress"))'
