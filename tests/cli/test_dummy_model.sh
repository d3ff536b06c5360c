#!/usr/bin/env bash
# Dummy model directories (dummy_weights.json + the real Qwen3 tokenizer, written by
# tools/make_dummy_model.py): tokenmill loads the preset's shapes with seeded random weights,
# generates deterministically within the vocabulary, serves them through `settings check`; bad
# markers and a tokenizer larger than the model's vocabulary fail with messages naming the cause.
set -euo pipefail
BIN="$1"
ROOT="${TM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
M="$TMP/dummy"

"$PY" "$ROOT/tools/make_dummy_model.py" "$M" --preset cpu-120m --quant q4g64 --vocab 151936
"$PY" - "$M" <<'PYEOF'
import json, sys
tok = json.load(open(sys.argv[1] + "/tokenizer.json", encoding="utf-8"))
ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
assert max(ids) == 151935 and len(set(ids)) == len(ids) == 151936, (max(ids), len(ids))
PYEOF

gen() { "$BIN" generate "$M" --prompt "The lighthouse keeper" -n 8 --ignore-eos --json --threads 2; }
gen > "$TMP/a.json"
gen > "$TMP/b.json"
cmp "$TMP/a.json" "$TMP/b.json" || { echo "dummy weights are not deterministic"; exit 1; }
"$PY" - "$TMP/a.json" <<'PYEOF'
import json, sys
out = json.load(open(sys.argv[1]))
ids = out["ids"]
assert len(ids) == 8 and all(0 <= i < 151936 for i in ids), ids
assert out["text"], out
PYEOF

# A BF16 KV cache: the same run, deterministic too; other element types are refused by name.
"$BIN" generate "$M" --prompt "The lighthouse keeper" -n 8 --ignore-eos --json --threads 2 \
  --kv-dtype bf16 > "$TMP/c.json"
"$PY" - "$TMP/c.json" <<'PYEOF'
import json, sys
ids = json.load(open(sys.argv[1]))["ids"]
assert len(ids) == 8 and all(0 <= i < 151936 for i in ids), ids
PYEOF
if "$BIN" generate "$M" --prompt x -n 1 --threads 2 --kv-dtype f16 > "$TMP/out" 2>&1; then
  echo "accepted --kv-dtype f16"; exit 1
fi
grep -q "kv-dtype" "$TMP/out" || { echo "expected a --kv-dtype error, got:"; cat "$TMP/out"; exit 1; }

cat > "$TMP/settings.json" <<JSON
{"models": [{"path": "$M", "name": "dummy", "kv_cache_dtype": "bf16"}]}
JSON
"$BIN" settings check "$TMP/settings.json" | grep -q "ok"

# Each broken marker: exit 1, and the message names what is wrong.
expect_fail() {  # pattern, marker json
  echo "$2" > "$M/dummy_weights.json"
  if "$BIN" generate "$M" --prompt x -n 1 --threads 2 > "$TMP/out" 2>&1; then
    echo "accepted a bad marker: $2"; exit 1
  fi
  grep -q "$1" "$TMP/out" || { echo "expected '$1' for $2, got:"; cat "$TMP/out"; exit 1; }
}
expect_fail 'unknown key "bits"' '{"preset": "cpu-120m", "bits": 4}'
expect_fail "unknown preset 'nope'" '{"preset": "nope"}'
expect_fail '"preset" is missing' '{"quant": "q4g64"}'
expect_fail "use bf16 or q<bits>g<group>" '{"preset": "cpu-120m", "quant": "int4"}'
expect_fail '"vocab" has the wrong type' '{"preset": "cpu-120m", "vocab": "big"}'
expect_fail "not valid JSON" '{"preset": '
expect_fail "tokenizer belongs to another model" '{"preset": "cpu-120m", "quant": "q4g64"}'

if "$PY" "$ROOT/tools/make_dummy_model.py" "$TMP/small" --preset cpu-120m --vocab 1000 2> "$TMP/err"; then
  echo "make_dummy_model accepted a vocabulary smaller than the tokenizer"; exit 1
fi
grep -q "more than --vocab 1000" "$TMP/err"
echo "dummy model: ok"
