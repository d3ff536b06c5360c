#!/usr/bin/env bash
# The one command run on the GPU machine (repository root as the working directory, .corpus/
# carried along, $OUT set by the device tool):
#     bash tools/device_job.sh
# Runs, within 8.5 minutes of wall clock in total:
#   D  tools/gen_golden.py  -> golden fixtures (CPU, float64 transformers), time-boxed
#   C  tools/train_demo.py  -> the demo model (GPU training + evaluation against transformers)
# D runs in the background at low priority while C trains on the GPU (D needs only a few CPU
# cores); SEQUENTIAL=1 runs D first instead. Each stage is its own subshell, so one failure
# keeps the other's results. GOLDEN_ARGS / DEMO_ARGS add arguments (a local dry run:
# PYTHON=/usr/bin/python3 GOLDEN_ARGS=--smoke DEMO_ARGS=--smoke OUT=/tmp/o bash tools/device_job.sh).
# Outputs in $OUT (at most 8 files, each < 16 MiB):
#   log.txt  golden.tar.gz  demo-1.tar .. demo-N.tar (unpack all into one directory)  result.json
set -u
: "${OUT:?set OUT to the output directory}"
PY="${PYTHON:-python3}"
START=$(date +%s)
TOTAL_S="${TOTAL_S:-510}"            # 8.5 minutes for everything
DEADLINE=$((START + TOTAL_S))
GOLDEN_S="${GOLDEN_S:-$([[ "${SEQUENTIAL:-0}" == 1 ]] && echo 200 || echo 420)}"  # golden time box
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/log.txt"
WORK="$(mktemp -d /tmp/tokenmill_device.XXXXXX)"

main() {

echo "== device_job start $(date -u +%FT%TZ) deadline in ${TOTAL_S}s; work dir $WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
"$PY" - <<'EOF' 2>&1
import sys, os
print("python", sys.version.split()[0], "cpus", os.cpu_count())
for m in ("torch", "transformers", "tokenizers", "safetensors", "jinja2", "matplotlib", "numpy"):
    try:
        mod = __import__(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", e)
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
for f in .corpus/train_code.txt .corpus/train_prose.txt .corpus/train_zh.txt \
         .corpus/heldout_code.txt tests/fixtures/templates/qwen35.jinja; do
  [[ -s "$f" ]] || echo "MISSING INPUT: $f (the demo stage will fail)"
done

golden() {
  ( timeout --signal=TERM --kill-after=10 "$GOLDEN_S" nice -n 10 \
      "$PY" tools/gen_golden.py --out "$WORK/golden" ${GOLDEN_ARGS:-} ) > "$WORK/golden.log" 2>&1 \
    && echo "== golden: OK" || echo "== golden: FAILED (rc $?; see the golden log below)"
}
demo() {
  local now; now=$(date +%s)
  ( timeout --signal=TERM --kill-after=10 $((DEADLINE - now - 15)) \
      "$PY" tools/train_demo.py --out "$WORK/demo" --deadline $((DEADLINE - 30)) ${DEMO_ARGS:-} ) \
    && echo "== demo: OK" || echo "== demo: FAILED (rc $?)"
}

if [[ "${SEQUENTIAL:-0}" == 1 ]]; then
  golden
  demo
else
  golden &
  GOLDEN_PID=$!
  demo
  wait "$GOLDEN_PID"
fi
echo "== golden log"
cat "$WORK/golden.log" 2>/dev/null | tail -60

echo "== packing $(($(date +%s) - START))s after start"
( "$PY" - "$WORK" "$OUT" <<'EOF'
import json, os, sys, tarfile
work, out = sys.argv[1], sys.argv[2]
limit = 15 * 1024 * 1024  # each file in $OUT stays under 16 MiB
result = {}
g = os.path.join(work, "golden")
if os.path.isdir(g):
    with tarfile.open(os.path.join(out, "golden.tar.gz"), "w:gz") as t:
        t.add(g, arcname="golden")
    result["golden_tar_bytes"] = os.path.getsize(os.path.join(out, "golden.tar.gz"))
    m = os.path.join(g, "manifest.json")
    if os.path.exists(m):
        result["golden_manifest"] = json.load(open(m))
d = os.path.join(work, "demo")
if os.path.isdir(d):
    files = []
    for dp, _, fs in os.walk(d):
        for f in fs:
            p = os.path.join(dp, f)
            files.append((os.path.getsize(p), os.path.relpath(p, work)))
    files.sort(key=lambda x: (-x[0], x[1]))
    bins = []  # first-fit decreasing
    for size, rel in files:
        for b in bins:
            if b[0] + size + 4096 <= limit:
                b[0] += size + 4096
                b[1].append(rel)
                break
        else:
            bins.append([size + 4096, [rel]])
    if len(bins) > 5:
        print("too many demo parts:", len(bins))
    for i, (_, rels) in enumerate(bins[:5]):
        with tarfile.open(os.path.join(out, "demo-%d.tar" % (i + 1)), "w") as t:
            for rel in sorted(rels):
                t.add(os.path.join(work, rel), arcname=rel)
    result["demo_parts"] = [sorted(b[1]) for b in bins]
    s = os.path.join(d, "summary.json")
    if os.path.exists(s):
        summ = json.load(open(s))
        summ.pop("errors", None)
        result["demo_summary"] = summ
    tl = os.path.join(d, "train_log.json")
    if os.path.exists(tl):
        t = json.load(open(tl))
        t["history"] = t["history"][-3:]
        result["demo_train_log"] = t
json.dump(result, open(os.path.join(out, "result.json"), "w"), indent=1, ensure_ascii=False)
print("packed:", sorted(os.listdir(out)))
EOF
) || echo "== packing: FAILED"
ls -la "$OUT"
echo "== device_job end after $(($(date +%s) - START))s"
}

main 2>&1 | tee -a "$LOG"
