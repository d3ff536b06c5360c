#!/usr/bin/env bash
# Builds a variant of tokenmill's binaries in which one CUDA source file is compiled with extra
# flags (a compile-time knob such as -DTM_Q4F=0 or -DTM_Q4F_DEPTH=8), for A/Bs against the
# build it comes from (tools/ab_bench.py runs both). Only that file is recompiled: its object
# replaces the one in a copy of the CUDA backend's library, and the binaries are relinked with
# the copy, so a variant takes seconds once the build exists.
#     tools/build_variant.sh BUILD_DIR OUT_DIR SOURCE.cu "FLAGS" [TARGET ...]
# e.g.
#     tools/build_variant.sh build-gpu /tmp/base cuda_gemv_q4g.cu "-DTM_Q4F=0" tokenmill
# writes /tmp/base/tokenmill. TARGETs default to tokenmill and tm_bench_linear_ops; they must
# already be built in BUILD_DIR (a Ninja build of this repository with the CUDA backend).
set -euo pipefail
if (($# < 4)); then
  echo "usage: $0 BUILD_DIR OUT_DIR SOURCE.cu FLAGS [TARGET ...]" >&2
  exit 2
fi
build=$1 out=$2 src=$3 flags=$4
shift 4
targets=("$@")
((${#targets[@]})) || targets=(tokenmill tm_bench_linear_ops)
[ -f "$build/build.ninja" ] || { echo "$0: $build has no build.ninja (configure with -G Ninja)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$build"
lib=src/backend/cuda/libtm_backend_cuda.a
obj=src/backend/cuda/CMakeFiles/tm_backend_cuda.dir/$src.o
[ -f "$lib" ] || { echo "$0: $build/$lib not built" >&2; exit 1; }
# The object's compile command, writing elsewhere (the build's own object and depfile stay).
cmd=$(ninja -t commands "$obj" | tail -1)
[ -n "$cmd" ] || { echo "$0: no compile command for $obj" >&2; exit 1; }
cmd=$(printf '%s' "$cmd" | sed -e "s#-o $obj#-o $out/$src.o#" -e "s#-MF [^ ]*#-MF $out/$src.d#")
eval "$cmd $flags"
cp "$lib" "$out/libtm_backend_cuda.a"
# ar replaces the member of the same name.
ar r "$out/libtm_backend_cuda.a" "$out/$src.o"
for t in "${targets[@]}"; do
  link=$(ninja -t commands "$t" | tail -1)
  [ -n "$link" ] || { echo "$0: no link command for $t" >&2; exit 1; }
  link=$(printf '%s' "$link" | sed -e "s#$lib#$out/libtm_backend_cuda.a#g" \
    -e "s#-o [^ ]*$t #-o $out/$t #")
  eval "$link"
  echo "$out/$t"
done
