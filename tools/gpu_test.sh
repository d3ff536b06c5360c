#!/usr/bin/env bash
# Builds tokenmill with the CUDA backend on the GPU machine and runs its checks, all within
# about 8 minutes of wall clock (TOTAL_S). Run from the repository root with .debs/ carried:
#     bash tools/gpu_test.sh
# .debs/ holds the Debian library packages, fetched on a Debian 12 machine with
#     mkdir -p .debs && cd .debs && apt-get download googletest libgtest-dev libgmock-dev \
#       libbenchmark-dev libbenchmark1debian libcli11-dev libcpp-httplib-dev libcpp-httplib0.11 \
#       libssl-dev zlib1g-dev libbrotli-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 \
#       libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 \
#       nlohmann-json3-dev
# (libssl-dev, zlib1g-dev and libbrotli-dev for the headers cpp-httplib's switches pull in);
# they are unpacked with dpkg -x into $DEPS and the build is pointed there (no network, no apt).
# Stages (each under `timeout`; a failing stage does not stop the next):
#   deps, configure, build (ninja -j16, TM_NATIVE=OFF),
#   tm_test_backend_cuda, tm_test_golden, the CPU unit tests (quick ones),
#   linops (tm_bench_linear_ops: decode matmul GB/s per format against the read probe),
#   bench (BENCH_PRESETS, default the 27B shape at q4g64 and bf16 and the 35B-A3B shape at q4g64,
#   dummy weights generated on the device),
#   compute-sanitizer memcheck on a short tm_test_backend_cuda filter (with the engine's
#   overlapped, recorded steps: replays of stale recordings showed up there),
#   http (not in the default list): server vs engine on a dummy 27B-shaped model,
#   profile (not in the default list): per-kernel time of one decode step (ncu,
#   tools/kernel_profile.py).
#   timeline (not in the default list): the real timeline of replayed decode steps
#   (tools/kernel_trace, tools/kernel_timeline.py): each kernel's share of the critical path.
# Logs: $OUT/<stage>.log and $OUT/summary.txt (printed last).
set -u
: "${OUT:=/tmp/tokenmill_gpu_out}"
DEPS="${DEPS:-/tmp/deps}"
BUILD="${BUILD:-build-gpu}"
JOBS="${JOBS:-16}"
TOTAL_S="${TOTAL_S:-470}"
STAGES="${STAGES:-deps configure build cuda golden cpu linops bench sanitizer}"
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

left() { echo $((DEADLINE - $(date +%s))); }
note() { echo "$*" | tee -a "$SUMMARY"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
# stage NAME LIMIT_S CMD...: runs CMD with a time limit (capped by what is left), logs to
# $OUT/NAME.log, records the outcome.
stage() {
  local name=$1 limit=$2
  shift 2
  local rest
  rest=$(( $(left) - 5 ))
  if (( rest < 10 )); then
    note "$name: SKIPPED (out of time)"
    return 1
  fi
  (( limit > rest )) && limit=$rest
  local t0 rc
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  note "$name: rc=$rc in $(( $(date +%s) - t0 ))s (limit ${limit}s)$( ((rc == 124)) && echo ' TIMED OUT')"
  return $rc
}

LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$DEPS/usr/share/pkgconfig"
# The .pc files say prefix=/usr: the sysroot maps their -I/-L paths into $DEPS.
export PKG_CONFIG_SYSROOT_DIR="$DEPS"
export PATH="/usr/local/cuda/bin:$PATH"

note "gpu_test start $(date -u +%FT%TZ); host $(hostname); $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
df -h /tmp | tail -1 | tee -a "$SUMMARY"

unpack() {
  set -e
  ls .debs/*.deb > /dev/null
  mkdir -p "$DEPS"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  ls "$LIBDIR" | head -50
}
configure() {
  cmake -S . -B "$BUILD" -G Ninja -DTM_CUDA=ON -DTM_NATIVE=OFF -DTM_WERROR=OFF \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" \
    -DCMAKE_LIBRARY_PATH="$LIBDIR" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 ${CMAKE_ARGS:-}
}

export DEPS LIBDIR BUILD
export -f unpack configure
want deps && stage deps 60 bash -c unpack
want configure && stage configure 90 bash -c configure
want build && stage build 300 ninja -C "$BUILD" -j "$JOBS" tokenmill tm_test_backend_cuda \
  tm_test_golden tm_test_backend_cpu tm_test_model tm_test_tensor tm_test_engine \
  tm_bench_linear_ops $(want timeline && echo tm_kernel_trace)
T="$BUILD/tests"
want cuda && stage cuda 150 "$T/tm_test_backend_cuda"
grep -E "^\[cuda model\]|FAILED|PASSED|SKIPPED \]" "$OUT/cuda.log" 2>/dev/null | head -40 >> "$SUMMARY"
want golden && stage golden 120 "$T/tm_test_golden"
grep -E "FAILED|PASSED" "$OUT/golden.log" 2>/dev/null | head -10 >> "$SUMMARY"
if want cpu; then
  for b in tm_test_backend_cpu tm_test_model tm_test_tensor tm_test_engine; do
    stage "cpu_$b" 60 "$T/$b" && true
    grep -E "FAILED|PASSED" "$OUT/cpu_$b.log" 2>/dev/null | head -5 >> "$SUMMARY"
  done
fi
if want linops; then
  stage linops 90 "$BUILD/bench/tm_bench_linear_ops" --device cuda && true
  tail -42 "$OUT/linops.log" >> "$SUMMARY"
fi
if want bench; then
  # Dummy weights are generated on the device (no files). BENCH_PRESETS: "preset:quant ...".
  BENCH_ARGS=(bench --dummy-weights --device cuda --prompt-lengths "${BENCH_PROMPTS:-512}"
              --contexts "${BENCH_CONTEXTS:-1024}" --batches "${BENCH_BATCHES:-1}"
              --decode-tokens "${BENCH_DECODE:-32}" ${BENCH_EXTRA:-})
  for pq in ${BENCH_PRESETS:-qwen3.5-27b:q4g64 qwen3.5-27b:bf16 qwen3.5-35b-a3b:q4g64}; do
    p=${pq%%:*} q=${pq##*:}
    stage "bench_${p}_${q}" "${BENCH_LIMIT:-120}" "$BUILD/tokenmill" "${BENCH_ARGS[@]}" \
      --preset "$p" --quant "$q" --json "$OUT/bench_${p}_${q}.json" \
      --chart "$OUT/bench_${p}_${q}.svg" && true
    tail -22 "$OUT/bench_${p}_${q}.log" >> "$SUMMARY"
  done
fi
if want http; then
  # The server against the engine on a dummy model (tools/make_dummy_model.py), through
  # tools/http_vs_engine.sh (python3 load generator; the tokenizer from node_modules).
  HTTP_PRESET="${HTTP_PRESET:-qwen3.5-27b:q4g64}"
  DUMMY="${DUMMY_DIR:-/tmp/tm-dummy-${HTTP_PRESET/:/-}}"
  python3 tools/make_dummy_model.py "$DUMMY" --preset "${HTTP_PRESET%%:*}" \
    --quant "${HTTP_PRESET##*:}" --vocab "${HTTP_VOCAB:-248320}" >> "$SUMMARY" 2>&1
  stage http "${HTTP_LIMIT:-300}" env OUT="$OUT/http" MEMORY_MB="${HTTP_MEMORY_MB:-24000}" \
    PREFILL_CHUNK="${HTTP_PREFILL_CHUNK:-1024}" MAX_STEP_TOKENS="${HTTP_MAX_STEP:-2048}" \
    LOADGEN_ARGS="${LOADGEN_ARGS:---long-prompt-words 340 --busy-streams 16}" \
    bash tools/http_vs_engine.sh "$BUILD/tokenmill" "$DUMMY" "${HTTP_STREAMS:-1,16,64}" \
    "${HTTP_TOKENS:-256}" -- --device cuda && true
  tail -25 "$OUT/http.log" >> "$SUMMARY"
fi
if want profile; then
  # ncu, one metric, every kernel of a short 27B q4g64 bench at the clocks the GPU chose; then
  # tools/kernel_profile.py's per-kernel table of one decode step (not in the default list).
  PROF_CSV="${PROF_CSV:-/tmp/tokenmill_prof.csv}"
  stage profile_ncu "${PROFILE_LIMIT:-150}" bash -c "ncu --graph-profiling node --clock-control none \
    --cache-control none --csv --print-units base --metrics gpu__time_duration.sum \
    $BUILD/tokenmill bench --dummy-weights --device cuda --preset qwen3.5-27b --quant q4g64 \
    --prompt-lengths 32 --contexts 64 --batches 1 --decode-tokens 3 > $PROF_CSV" && true
  python3 tools/kernel_profile.py "$PROF_CSV" > "$OUT/profile.log" 2>&1 && true
  cat "$OUT/profile.log" >> "$SUMMARY"
fi
if want timeline; then
  # The real timeline of replayed decode steps (tools/kernel_trace: CUPTI activity records, no
  # serialization), then tools/kernel_timeline.py's per-kernel critical path (not in the default
  # list). TIMELINE_PRESETS: "preset:quant ...".
  for pq in ${TIMELINE_PRESETS:-qwen3.5-27b:q4g64 qwen3.5-35b-a3b:q4g64}; do
    p=${pq%%:*} q=${pq##*:}
    stage "timeline_${p}_${q}" 120 env CUDA_INJECTION64_PATH="$BUILD/tools/kernel_trace/libtm_kernel_trace.so" \
      TM_KERNEL_TRACE="$OUT/trace_${p}_${q}.csv" "$BUILD/tokenmill" bench --dummy-weights \
      --device cuda --preset "$p" --quant "$q" --prompt-lengths 32 --contexts 1024 \
      --batches "${TIMELINE_BATCHES:-1}" --decode-tokens 16 && true
    python3 tools/kernel_timeline.py "$OUT/trace_${p}_${q}.csv" > "$OUT/timeline_${p}_${q}.txt" 2>&1 && true
    head -30 "$OUT/timeline_${p}_${q}.txt" >> "$SUMMARY"
  done
fi
if want sanitizer; then
  stage sanitizer 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$T/tm_test_backend_cuda" \
    --gtest_filter='CudaOps.*:CudaPick.*:CudaAttention.*:CudaGdn.*:CudaMoe.*:CudaLinear.StackedExperts*:CudaLinear.MultiMatches*:CudaLinear.Q4Decode*:CudaLinear.ManyTiles*:CudaEngine.OverlappedStepsEqualWaitingSteps'
  grep -E "ERROR SUMMARY|FAILED|PASSED" "$OUT/sanitizer.log" 2>/dev/null | head -5 >> "$SUMMARY"
fi
note "gpu_test done in $(( $(date +%s) - START ))s"
cat "$SUMMARY"
