#!/usr/bin/env bash
# `tokenmill run` samples with the model's generation_config.json unless a flag says otherwise
# (the bundled demo model ships temperature 0.7, top_p 0.9, top_k 20, repetition_penalty 1.1),
# falls back to the built-in defaults without one, and reproduces a reply for the same seed.
set -euo pipefail
BIN="$1"
ROOT="${TM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
DEMO="$ROOT/models/demo"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
run() { "$BIN" run "$@" -p "Tell me about lighthouses." -n 12 --threads 2 --no-color; }
expect() {  # pattern, file
  grep -q -- "$1" "$2" || { echo "expected '$1' in:"; cat "$2"; exit 1; }
}

run "$DEMO" > "$TMP/a.out" 2> "$TMP/a.err"
expect "sampling: temperature 0.7, top_p 0.9, top_k 20, min_p 0, repetition_penalty 1.1" "$TMP/a.err"
expect "defaults from generation_config.json" "$TMP/a.err"

run "$DEMO" --temperature 0 --top-k 5 --repetition-penalty 1 > "$TMP/g1.out" 2> "$TMP/g1.err"
expect "temperature 0, top_p 0.9, top_k 5, min_p 0, repetition_penalty 1;" "$TMP/g1.err"
run "$DEMO" --temperature 0 --top-k 5 --repetition-penalty 1 > "$TMP/g2.out" 2> /dev/null
cmp "$TMP/g1.out" "$TMP/g2.out" || { echo "greedy replies differ"; exit 1; }

run "$DEMO" --seed 7 > "$TMP/s1.out" 2> /dev/null
run "$DEMO" --seed 7 > "$TMP/s2.out" 2> /dev/null
cmp "$TMP/s1.out" "$TMP/s2.out" || { echo "replies with the same seed differ"; exit 1; }

# The same model without generation_config.json: the built-in defaults.
mkdir "$TMP/plain"
for f in "$DEMO"/*; do
  [ "$(basename "$f")" = generation_config.json ] || ln -s "$f" "$TMP/plain/"
done
run "$TMP/plain" --seed 1 > /dev/null 2> "$TMP/p.err"
expect "temperature 1, top_p 1, top_k 0, min_p 0, repetition_penalty 1;" "$TMP/p.err"
expect "no generation_config.json: built-in defaults" "$TMP/p.err"

if "$BIN" run "$DEMO" -p hi -n 0 --threads 2 > /dev/null 2> "$TMP/bad.err"; then
  echo "accepted --max-tokens 0"; exit 1
fi
expect "max-tokens must be at least 1" "$TMP/bad.err"
# Sampling flags outside their ranges fail with the parameter's name (they used to run).
for bad in "--temperature -1:temperature must be" "--top-p 2:top_p must be" "--top-k -2:top_k must be"; do
  if "$BIN" generate "$DEMO" -p hi -n 2 --threads 2 ${bad%%:*} > /dev/null 2> "$TMP/bad.err"; then
    echo "generate accepted ${bad%%:*}"; exit 1
  fi
  expect "${bad#*:}" "$TMP/bad.err"
done
if "$BIN" generate "$DEMO" -p hi -n 2 --threads -3 > /dev/null 2> "$TMP/bad.err"; then
  echo "generate accepted --threads -3"; exit 1
fi
expect "threads" "$TMP/bad.err"
echo "run: ok"
