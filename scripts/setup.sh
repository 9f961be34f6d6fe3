#!/usr/bin/env bash
# Installs every Debian package libkvcache's build, tests, tools and CI need,
# then (unless KVC_SETUP_PYTHON=0, as the main job sets it) the Python venvs of
# the transformers / kvpress tests (scripts/setup-python.sh: outside the
# repository, once per machine; torch alone is ~5.6 GB).
# Idempotent and quiet: apt-get runs only when something is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python_venvs() {
  if [ "${KVC_SETUP_PYTHON:-1}" != 0 ]; then
    bash "$here/setup-python.sh"
  fi
}

packages=(
  build-essential cmake ninja-build pkg-config
  libcmocka-dev libbenchmark-dev libssl-dev libxxhash-dev libcli11-dev nlohmann-json3-dev
  libicu-dev libopenblas-dev doxygen abigail-tools clang clang-format libclang-rt-14-dev gnuplot-nox python3 python3-pip python3-venv python3-dev unzip
  bindgen libclang-dev  # Rust bindings: bindgen regenerates kvcache-sys (cargo, rustc: rustup, ~/.cargo/bin)
  swig golang-go openjdk-17-jdk-headless junit4  # SWIG bindings: Python, Go (cgo), Java (JNI, JUnit 4)
  libhiredis-dev redis-server redis-tools  # Redis tier: hiredis client; the tests start their own servers and a 3-node cluster
  ccache  # scripts/test.sh: the stages' C / C++ compiles go through it (objects reused across runs)
)

# Python test tools of the bindings (PyPI): numpy and pytest for the tests
# (the pip package's tests reuse them in their virtual environments; pip
# fetches the package's build tools, scikit-build-core and swig, itself).
python_setup() {
  if python3 -c "import numpy, pytest" 2>/dev/null; then
    echo "setup: python packages present"
    return 0
  fi
  echo "setup: pip install numpy pytest"
  python3 -m pip install -q numpy pytest 2>&1 | grep -v -i "warning: running pip as" || true
  if ! python3 -c "import numpy, pytest" 2>/dev/null; then
    # Debian 12's own python3 refuses pip installs into it (PEP 668,
    # "externally-managed-environment"): take Debian's packages instead.
    if [ "$(command -v python3)" = /usr/bin/python3 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: python3 is Debian's: apt-get install python3-numpy python3-pytest"
      local sudo=""
      [ "$(id -u)" -ne 0 ] && sudo="sudo"
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        python3-numpy python3-pytest > /dev/null
    fi
  fi
  python3 -c "import numpy, pytest"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  python_setup
  python_venvs
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "setup: run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
echo "setup: done"
python_setup
python_venvs
