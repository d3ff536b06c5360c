#!/usr/bin/env bash
# The server's overhead, measured: `tokenmill bench` on a model (the engine alone), then the same
# model behind `tokenmill start` driven by tools/loadgen.py over streaming HTTP (standard-library
# client, so it runs wherever python3 does). Prints both; writes $OUT/engine.json and $OUT/http.json.
#   tools/http_vs_engine.sh path/to/tokenmill MODEL_DIR [STREAMS] [MAX_TOKENS] [-- extra bench args]
# STREAMS: comma list of concurrent streams (default 1,16); MAX_TOKENS per stream (default 256).
# Extra arguments after -- go to both bench and start (e.g. --device cuda).
# Server settings from the environment: MEMORY_MB (KV + state budget, default 2048),
# PREFILL_CHUNK (default 256), MAX_STEP_TOKENS (default 512); LOADGEN_ARGS go to loadgen.py.
# MODEL_DIR may be a dummy model (tools/make_dummy_model.py) to measure real shapes.
set -euo pipefail
bin="$(realpath "$1")"
model="$(realpath "$2")"
streams="${3:-1,16}"
max_tokens="${4:-256}"
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
extra=("$@")
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
max_streams=$(tr ',' '\n' <<< "$streams" | sort -n | tail -1)

echo "== engine: tokenmill bench"
"$bin" bench "$model" --prompt-lengths 64 --contexts 128 --batches "$streams" \
  --decode-tokens "$max_tokens" --json "$out/engine.json" --chart "$out/engine.svg" "${extra[@]}" |
  grep -E "decode @|batch "

source "$root/tools/daemon_lib.sh"
daemon_start "$bin" "{\"limits\": {\"max_seqs\": $max_streams, \"prefill_chunk\": ${PREFILL_CHUNK:-256},
            \"max_step_tokens\": ${MAX_STEP_TOKENS:-512}},
 \"cache\": {\"memory_budget_mb\": ${MEMORY_MB:-2048}},
 \"models\": [{\"path\": \"$model\", \"name\": \"bench\", \"max_output_tokens\": $((max_tokens + 16))}]}" \
  bench-key --wait 300 "${extra[@]}" > /dev/null

echo "== HTTP: tools/loadgen.py (streaming chat completions)"
python3 "$root/tools/loadgen.py" --url "http://127.0.0.1:$daemon_port" --key bench-key --model bench \
  --streams "$streams" --max-tokens "$max_tokens" --json "$out/http.json" ${LOADGEN_ARGS:-}
echo "results in $out"
