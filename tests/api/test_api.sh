#!/usr/bin/env bash
# API tests with the official clients (openai@4, @anthropic-ai/sdk) against a real
# `tokenmill serve` of the bundled demo model: starts the server on a free port with an API key,
# runs node's test runner over tests/api/*.test.mjs, stops the server. It asks for
# --batch-precision fast, which the CPU backend does not run: /api/status must report exact.
#   tests/api/test_api.sh path/to/tokenmill [model-dir]
set -euo pipefail
bin="$(realpath "$1")"
root="${TM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
model="${2:-$root/models/demo}"
[ -f "$model/config.json" ] || { echo "test_api: $model has no config.json (build the demo model first)"; exit 1; }
[ -d "$root/node_modules/openai" ] || { echo "test_api: node_modules missing: run npm ci"; exit 1; }

source "$root/tools/daemon_lib.sh"
daemon_start "$bin" "{\"server\": {\"keepalive_interval_ms\": 200, \"max_body_bytes\": 1048576},
 \"limits\": {\"max_seqs\": 16},
 \"models\": [{\"path\": \"$model\", \"name\": \"demo\", \"max_output_tokens\": 4096}]}" \
  test-key --threads 2 --batch-precision fast --wait 120

export TM_API_URL="http://127.0.0.1:$daemon_port" TM_API_KEY=test-key TM_MODEL=demo
cd "$root"
node --test --test-concurrency=1 tests/api/
