#!/usr/bin/env bash
# `tokenmill bench` on the bundled demo model (CPU): the printed table has every requested
# prefill length (with its TFLOP/s against the matmul probe), decode context and batch size; the
# JSON report carries the measured device figures, the per-test rates and the peak memory; the chart is a complete SVG document;
# a missing model directory, a zero batch size, an unknown --prefill-precision or --batch-precision
# and a top-p above 1 fail with messages naming them; --temperature/--top-k/--top-p/--presence-penalty sample and the
# report says so; --profile-ops prints the timed prompts' ops apart from the decode runs';
# --write-checkpoint writes a preset's model to disk, and `bench DIR` reports its load rate.
# (Contexts shorter than the batch sweep's 64-token prompts once made the batch sweep overflow
# the context window.)
set -euo pipefail
BIN="$1"
ROOT="${TM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3

"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 32,64 \
  --contexts 32,128 --batches 1,2 --decode-tokens 4 --json "$TMP/b.json" --chart "$TMP/b.svg" \
  > "$TMP/out.txt" 2> "$TMP/err.txt"
for line in "prefill 32 " "prefill 64 " "TFLOP/s (" "decode @ context 32 " "decode @ context 128 " \
  "batch 1 " "batch 2 " "peak host memory" "peak backend memory" "measured read bandwidth"; do
  grep -q "$line" "$TMP/out.txt" || { echo "bench output lacks '$line'"; cat "$TMP/out.txt"; exit 1; }
done
"$PY" - "$TMP/b.json" "$TMP/b.svg" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["read_gbps"] > 0 and r["bf16_matmul_tflops"] > 0, r
assert r["weight_bytes_per_token"] > 0, r
assert [p["tokens"] for p in r["prefill"]] == [32, 64], r["prefill"]
assert all(p["tok_s"] > 0 and p["ttft_s"] > 0 for p in r["prefill"]), r["prefill"]
# The prefill roofline: FLOP/s from the model's arithmetic, and its share of the matmul probe.
for p in r["prefill"]:
    assert p["tflops"] > 0, p
    assert abs(p["pct_of_matmul"] - 100 * p["tflops"] / r["bf16_matmul_tflops"]) < 1e-6 * p["pct_of_matmul"], p
assert [d["context"] for d in r["decode"]] == [32, 128], r["decode"]
assert all(d["tok_s"] > 0 and d["gbps"] > 0 for d in r["decode"]), r["decode"]
assert [b["seqs"] for b in r["batch"]] == [1, 2], r["batch"]
b2 = r["batch"][1]
assert abs(b2["per_seq_tok_s"] * 2 - b2["aggregate_tok_s"]) < 1e-6 * b2["aggregate_tok_s"], b2
# The backend held at least the KV/state cache it reports.
assert r["peak_backend_bytes"] >= r["cache_bytes"] > 0, r
# --kv-dtype auto (the default) resolves to the exact F32 cache on the CPU backend.
assert r["kv_dtype"] == "f32", r["kv_dtype"]
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") or "<svg" in svg[:200], svg[:200]
assert svg.rstrip().endswith("</svg>"), svg[-200:]
PYEOF

if "$BIN" bench "$TMP/no-such-model" --device cpu > "$TMP/o2.txt" 2>&1; then
  echo "bench on a missing directory succeeded"; exit 1
fi
grep -q "no-such-model" "$TMP/o2.txt" || { echo "error does not name the directory:"; cat "$TMP/o2.txt"; exit 1; }
if "$BIN" bench "$ROOT/models/demo" --device cpu --batches 0 > "$TMP/o3.txt" 2>&1; then
  echo "bench with --batches 0 succeeded"; exit 1
fi
grep -qi "batch" "$TMP/o3.txt" || { echo "error does not name the batch option:"; cat "$TMP/o3.txt"; exit 1; }
# --prefill-precision takes exact or fast only; fast on the CPU backend says it changes nothing.
if "$BIN" bench "$ROOT/models/demo" --device cpu --prefill-precision half > "$TMP/o4.txt" 2>&1; then
  echo "bench with --prefill-precision half succeeded"; exit 1
fi
grep -q "prefill-precision" "$TMP/o4.txt" || { echo "error does not name --prefill-precision:"; cat "$TMP/o4.txt"; exit 1; }
"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 16 --contexts 16 \
  --batches 1 --decode-tokens 2 --prefill-precision fast --json "$TMP/c.json" --chart "$TMP/c.svg" \
  > "$TMP/o5.txt" 2>&1
grep -q "no effect on the CPU backend" "$TMP/o5.txt" || { echo "no note for fast on CPU:"; cat "$TMP/o5.txt"; exit 1; }
# --batch-precision: the same choices and the same note.
if "$BIN" bench "$ROOT/models/demo" --device cpu --batch-precision f16 > "$TMP/o9.txt" 2>&1; then
  echo "bench with --batch-precision f16 succeeded"; exit 1
fi
grep -q "batch-precision" "$TMP/o9.txt" || { echo "error does not name --batch-precision:"; cat "$TMP/o9.txt"; exit 1; }
"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 16 --contexts 16 \
  --batches 1 --decode-tokens 2 --batch-precision fast --json "$TMP/f.json" --chart "$TMP/f.svg" \
  > "$TMP/o10.txt" 2>&1 || { echo "bench --batch-precision fast failed:"; cat "$TMP/o10.txt"; exit 1; }
grep -q -- "--batch-precision fast has no effect on the CPU backend" "$TMP/o10.txt" || { echo "no note for --batch-precision fast on CPU:"; cat "$TMP/o10.txt"; exit 1; }
"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 16 --contexts 16 \
  --batches 1 --decode-tokens 2 --no-l2-prefetch --json "$TMP/e.json" --chart "$TMP/e.svg" \
  > "$TMP/o8.txt" 2>&1 || { echo "bench --no-l2-prefetch failed:"; cat "$TMP/o8.txt"; exit 1; }
grep -q -- "--no-l2-prefetch has no effect on the CPU backend" "$TMP/o8.txt" || { echo "no note for --no-l2-prefetch on CPU:"; cat "$TMP/o8.txt"; exit 1; }
# Sampled decoding: the report and the JSON say how tokens were chosen; greedy is the default.
grep -q "sampling: greedy" "$TMP/out.txt" || { echo "no greedy sampling line:"; cat "$TMP/out.txt"; exit 1; }
"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 16 --contexts 16 \
  --batches 2 --decode-tokens 4 --temperature 0.7 --top-k 20 --top-p 0.9 --presence-penalty 1.5 \
  --json "$TMP/d.json" --chart "$TMP/d.svg" > "$TMP/o6.txt" 2>&1
grep -q "sampling: temperature 0.7, top-k 20, top-p 0.9, presence penalty 1.5" "$TMP/o6.txt" || { echo "no sampling line:"; cat "$TMP/o6.txt"; exit 1; }
"$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["sampling"].startswith("temperature 0.7"), r["sampling"]; assert r["batch"][0]["aggregate_tok_s"] > 0, r' "$TMP/d.json"
if "$BIN" bench "$ROOT/models/demo" --device cpu --top-p 1.5 > "$TMP/o7.txt" 2>&1; then
  echo "bench with --top-p 1.5 succeeded"; exit 1
fi
grep -q "top-p" "$TMP/o7.txt" || { echo "error does not name --top-p:"; cat "$TMP/o7.txt"; exit 1; }
# --profile-ops reports the timed prompts apart from the decode runs: a 100-row prompt's ops are
# "[large]" in the first table; the decode runs' prompts (16 rows) and the batch sweep's (64)
# leave none in the second; the linear ops' rows give their TFLOP/s.
"$BIN" bench "$ROOT/models/demo" --device cpu --threads 2 --prompt-lengths 100 --contexts 16 \
  --batches 1 --decode-tokens 2 --profile-ops --json "$TMP/f.json" --chart "$TMP/f.svg" \
  > "$TMP/o9.txt" 2>&1 || { echo "bench --profile-ops failed:"; cat "$TMP/o9.txt"; exit 1; }
"$PY" - "$TMP/o9.txt" <<'PYEOF'
import sys
text = open(sys.argv[1]).read()
head1 = "per-op device time (--profile-ops), the timed prompts"
head2 = "per-op device time (--profile-ops), the decode runs and the batch sweep"
assert head1 in text and head2 in text, text
first = text.split(head1, 1)[1].split(head2, 1)[0]
second = text.split(head2, 1)[1]
assert "[large]" in first and "  total " in first, first
assert "[small]" in second and "[large]" not in second and "  total " in second, second
# The linear ops' rows (and the dense MLP block's) carry their rate: 2 x 100 rows x the label's
# matrices, per call, over the row's time; the other ops' rows none.
import re
row = re.compile(r"^  (\S.*?) \[large\]\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%(?:\s+(\S+))?$")
linear_rows = 0
for line in first.splitlines():
    m = row.match(line)
    if not m:
        continue
    name, calls, ms, rate = m.group(1), int(m.group(2)), float(m.group(3)), m.group(6)
    if name.split()[0].endswith(("linear", "linear_multi", "mlp_block")):
        assert rate is not None, line
        macs = sum(int(r) * int(c) for r, c in re.findall(r"(\d+)x(\d+)", name))
        want = calls * 2 * 100 * macs / (ms * 1e-3) / 1e12
        assert abs(float(rate) - want) <= 0.01 * want, (line, want)
        linear_rows += 1
    else:
        assert rate is None, line
assert linear_rows >= 4, first
PYEOF
# --write-checkpoint: the preset's dummy weights as a model directory; `bench DIR` loads it and
# reports the checkpoint's bytes and the load's rate; a directory holding a model is refused, as
# is the option without --preset.
"$BIN" bench --preset cpu-120m --quant q4g64 --write-checkpoint "$TMP/m" > "$TMP/w.txt" 2>&1 \
  || { echo "bench --write-checkpoint failed:"; cat "$TMP/w.txt"; exit 1; }
grep -q "wrote $TMP/m: " "$TMP/w.txt" || { echo "no 'wrote' line:"; cat "$TMP/w.txt"; exit 1; }
"$BIN" bench "$TMP/m" --device cpu --threads 2 --prompt-lengths 16 --contexts 16 --batches 1 \
  --decode-tokens 2 --json "$TMP/m.json" --chart "$TMP/m.svg" > "$TMP/o10.txt" 2>&1 \
  || { echo "bench of the written checkpoint failed:"; cat "$TMP/o10.txt"; exit 1; }
grep -q "GB of checkpoint files, [0-9.]* GB/s)" "$TMP/o10.txt" || { echo "no load rate:"; cat "$TMP/o10.txt"; exit 1; }
"$PY" -c 'import json,os,sys; r=json.load(open(sys.argv[1])); n=os.path.getsize(sys.argv[2]); assert r["load_bytes"] == n, (r["load_bytes"], n); assert r["decode"][0]["tok_s"] > 0, r' \
  "$TMP/m.json" "$TMP/m/model.safetensors"
"$PY" -c 'import glob,json,os,sys; r=json.load(open(sys.argv[1])); n=sum(map(os.path.getsize, glob.glob(sys.argv[2] + "/*.safetensors"))); assert r["load_bytes"] == n > 0, (r["load_bytes"], n)' \
  "$TMP/b.json" "$ROOT/models/demo"
if "$BIN" bench --preset cpu-120m --write-checkpoint "$TMP/m" > "$TMP/o11.txt" 2>&1; then
  echo "bench --write-checkpoint over a model succeeded"; exit 1
fi
grep -q "already holds a model" "$TMP/o11.txt" || { echo "no refusal:"; cat "$TMP/o11.txt"; exit 1; }
if "$BIN" bench "$TMP/m" --write-checkpoint "$TMP/m2" > "$TMP/o12.txt" 2>&1; then
  echo "bench --write-checkpoint without --preset succeeded"; exit 1
fi
grep -q -- "--write-checkpoint DIR needs --preset" "$TMP/o12.txt" || { echo "no message:"; cat "$TMP/o12.txt"; exit 1; }
echo "bench: ok"
