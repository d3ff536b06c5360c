#!/usr/bin/env bash
# The test command: installs what the tests need, builds with warnings as errors (the CUDA code
# too where nvcc exists), checks formatting, and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps

cuda_args=()
if command -v nvcc >/dev/null 2>&1; then
  cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
jobs=$(nproc)
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_WERROR=ON "${cuda_args[@]}"
cmake --build build-test -j "$jobs"

scripts/format.sh --check

cd build-test
ctest --output-on-failure -j "$jobs" --timeout 900
