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
#     engines/  the serving engines' packages for the adapters' contract tests
#               (sglang_*, lmcache_*, vllm_*; docs/engines.md), installed --no-deps (they pin their
#               own torch and CUDA stacks), with the light modules their
#               interface classes import at load time; transformers from hf/
#
#     llamacpp/ only with KVCACHE_LLAMACPP=1: llama-cpp-python built from source (over 10
#               minutes on 2 cores) for the end-to-end llama.cpp test (llamacpp_restore_in_llama,
#               registered by configure where this venv exists) and bench/peers/llamacpp_kv.py
#
# torch is installed once: hf/, kvpress/ and engines/ see torch/'s site-packages
# (engines/ also hf/'s) through a .pth file (a venv's --system-site-packages would reach the interpreter's own
# site-packages, not another venv's). Each venv records what it was built from
# in kvc-requirements.txt; a venv whose record differs from this script's pins
# is rebuilt. Exit status 0 when all of them work.
set -euo pipefail

root=${KVCACHE_VENV_DIR:-${XDG_CACHE_HOME:-${HOME:-.}/.cache}/kvcache/venv}
python=${PYTHON:-python3}

torch_pins=(torch==2.10.0 numpy==2.3.5 pytest==9.0.2)
hf_pins=(transformers==5.24.0 gguf==0.19.0 accelerate==1.15.0 optimum-quanto==0.2.7 hqq==0.2.8.post1
  scikit-build-core==1.1.2 build==1.6.1 cmake==4.4.5 ninja==1.13.2 swig==4.5.1)
kvpress_pins=(kvpress==0.5.5 transformers==5.2.0 gguf==0.19.0 accelerate==1.15.0)
# engines/: what sglang's HiCache storage interface and its host KV pools, and
# lmcache's storage manager and plugins, import at load time (found by
# importing them on the CPU), then the engines --no-deps.
engines_pins=(aiohttp==3.14.5 apache-tvm-ffi==0.1.15.post2 compressed-tensors==0.20.1 dill==0.4.1
  ipython==9.18.1 msgspec==0.23.0 orjson==3.13.0 pillow==13.0.0 psutil==7.2.2 pybase64==1.5.1
  pydantic==2.14.4 pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3 starlette==1.10.0
  tqdm==4.70.1 aiofile==3.12.3 cachetools==8.0.2 cryptography==50.0.2 numba==0.68.1
  prometheus_client==0.26.0 py-cpuinfo==9.0.0 sortedcontainers==2.4.0)
# vllm pins torch 2.14 and CUDA kernels; --no-deps beside our torch its compiled ops do not
# load (not needed: the connector API, the scheduler and the KV cache manager are Python).
# What vllm's config, scheduler and connector modules import at load time is listed after it.
engines_nodeps=(sglang==0.5.23 torchvision==0.25.0 lmcache==0.5.6
  vllm==0.33.0 cbor2==6.3.0 cloudpickle==3.1.3 fastapi==0.165.0 llguidance==1.9.1 openai==3.57.0
  openai-harmony==0.0.8 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
  opentelemetry-semantic-conventions==0.66b2 partial-json-parser==0.2.1.1.post7 sniffio==1.3.1
  uvloop==0.23.0 xgrammar==0.2.9)

# make_venv NAME BASE_SITES PINS...: (re)creates $root/NAME unless its record
# matches. BASE_SITES: site-packages folders the venv sees, ':'-separated.
# $NODEPS (words): packages installed after PINS with pip --no-deps.
make_venv() {
  local name=$1 base=$2
  shift 2
  local dir=$root/$name want
  want=$(printf '%s\n' "python=$("$python" -c 'import sys; print(sys.version.split()[0])')" "base=$base" "$@" \
    ${NODEPS:+"nodeps=$NODEPS"})
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
    echo "$base" | tr ':' '\n' > "$site/kvc-torch-venv.pth"
  fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "$@"
  if [ -n "${NODEPS:-}" ]; then
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps $NODEPS
  fi
  echo "$want" > "$dir/kvc-requirements.txt"
}

mkdir -p "$root"
make_venv torch "" "${torch_pins[@]}"
torch_site=$("$root/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
make_venv hf "$torch_site" "${hf_pins[@]}"
make_venv kvpress "$torch_site" "${kvpress_pins[@]}"
hf_site=$("$root/hf/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NODEPS="${engines_nodeps[*]}" make_venv engines "$hf_site:$torch_site" "${engines_pins[@]}"

if [ "${KVCACHE_LLAMACPP:-0}" = 1 ]; then
  make_venv llamacpp "" llama-cpp-python==0.3.36 numpy==2.3.5
  "$root/llamacpp/bin/python" -c 'import llama_cpp; print("setup-python: llamacpp venv: llama-cpp-python", llama_cpp.__version__)'
fi

"$root/hf/bin/python" -c 'import torch, transformers, gguf, accelerate; print("setup-python: hf venv: torch", torch.__version__, "transformers", transformers.__version__)'
"$root/kvpress/bin/python" -c 'import importlib.metadata as m, torch, transformers, kvpress; print("setup-python: kvpress venv: torch", torch.__version__, "transformers", transformers.__version__, "kvpress", m.version("kvpress"))'
"$root/engines/bin/python" -c 'import importlib.metadata as m, torch; from sglang.srt.mem_cache.hicache_storage import HiCacheStorage; from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface; from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1; from vllm.v1.core.sched.scheduler import Scheduler; print("setup-python: engines venv: torch", torch.__version__, "sglang", m.version("sglang"), "lmcache", m.version("lmcache"), "vllm", m.version("vllm"))'
