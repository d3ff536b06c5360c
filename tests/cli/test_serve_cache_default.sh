#!/usr/bin/env bash
# The server's default cache on the CPU: 2 GiB of KV blocks with the state slots of max_seqs
# sequences on top. With 4096 slots of the demo model (3,360 MiB of recurrent state, more than
# the 2 GiB alone, as 16 slots of a 27B model are) it starts, serves a request, and
# `/api/status` reports the cache it got; a budget given in the settings is kept as given, and
# one too small for the slots fails at startup with a message saying what to change.
set -euo pipefail
BIN="$1"
ROOT="${TM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
source "$ROOT/tools/daemon_lib.sh"
daemon_start "$BIN" "{\"limits\": {\"max_seqs\": 4096},
 \"models\": [{\"path\": \"$ROOT/models/demo\", \"name\": \"demo\"}]}" key --threads 2 --wait 60
out=$(curl -s -H 'Authorization: Bearer key' -H 'content-type: application/json' \
  "http://127.0.0.1:$daemon_port/v1/completions" -d '{"model": "demo", "prompt": "Once", "max_tokens": 3}')
echo "$out" | grep -q '"completion_tokens":3' || { echo "no completion: $out"; exit 1; }
status=$(curl -s -H 'Authorization: Bearer key' "http://127.0.0.1:$daemon_port/api/status")
/usr/bin/python3 - "$status" <<'PYEOF'
import json, sys
mem = json.loads(sys.argv[1])["models"][0]["memory"]
# 4096 slots of 860,160 bytes, and 2 GiB of KV blocks of 32 KiB.
assert mem["state_slots_total"] == 4096, mem
assert mem["budget_bytes"] == 4096 * 860160 + (2048 << 20), mem
assert mem["kv_blocks_total"] == (2048 << 20) // (32 << 10), mem
PYEOF
daemon_stop
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/s.json" <<JSON
{"limits": {"max_seqs": 4096}, "cache": {"memory_budget_mb": 2048},
 "models": [{"path": "$ROOT/models/demo", "name": "demo"}]}
JSON
if timeout 60 "$BIN" serve --settings "$TMP/s.json" --device cpu --threads 2 --port 0 > "$TMP/out" 2>&1; then
  echo "a 2048 MiB budget for 4096 slots was accepted"; exit 1
fi
grep -q "cache memory budget of 2048 MiB is too small: 4096 state slots need 3360 MiB" "$TMP/out" \
  || { echo "no budget error:"; cat "$TMP/out"; exit 1; }
echo "serve cache default: ok"
