#!/usr/bin/env bash
# `tokenmill inspect` on a tiny MLX-quantized Qwen3.5 checkpoint written here by a separate Python
# safetensors writer (not tokenmill's), checking the report against numbers Python derives from
# the tensors it wrote; then broken directories must exit 1 with one "error: ..." line.
set -euo pipefail
BIN="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3

$PY - "$TMP/model" <<'EOF'
import json, os, random, struct, sys

out = sys.argv[1]
os.makedirs(out)
H, V, I, LAYERS = 128, 64, 256, 8
HEADS, KV, D = 2, 1, 64
HK, HV, DK, DV, K = 1, 2, 32, 32, 4
BITS, GROUP = 4, 64
P = "language_model.model."
overrides = {P + "layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
             P + "layers.1.linear_attn.in_proj_b": False}
quant = {"group_size": GROUP, "bits": BITS, "mode": "affine", **overrides}
text = {"model_type": "qwen3_5_text", "vocab_size": V, "hidden_size": H, "intermediate_size": I,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
        "head_dim": D, "full_attention_interval": 4, "linear_num_key_heads": HK,
        "linear_num_value_heads": HV, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_conv_kernel_dim": K, "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_theta": 10000000, "partial_rotary_factor": 0.25}}
config = {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False,
          "quantization": quant, "quantization_config": quant}
json.dump(config, open(os.path.join(out, "config.json"), "w"))

tensors = []  # (name, dtype, shape)
params = {"text": 0, "mtp": 0}
def prod(s):
    n = 1
    for d in s: n *= d
    return n
def add(name, shape, linear, kind="text"):
    params[kind] += prod(shape)
    module = name[:-len(".weight")]
    q = overrides.get(module, {"bits": BITS, "group_size": GROUP}) if linear else False
    if kind != "text" or not q:
        tensors.append((name, "BF16", shape))
        return
    bits, group = q["bits"], q["group_size"]
    tensors.append((name, "U32", shape[:-1] + [shape[-1] * bits // 32]))
    tensors.append((module + ".scales", "BF16", shape[:-1] + [shape[-1] // group]))
    tensors.append((module + ".biases", "BF16", shape[:-1] + [shape[-1] // group]))
def attention(p, kind):
    add(p + "self_attn.q_proj.weight", [HEADS * 2 * D, H], True, kind)
    add(p + "self_attn.k_proj.weight", [KV * D, H], True, kind)
    add(p + "self_attn.v_proj.weight", [KV * D, H], True, kind)
    add(p + "self_attn.o_proj.weight", [H, HEADS * D], True, kind)
    add(p + "self_attn.q_norm.weight", [D], False, kind)
    add(p + "self_attn.k_norm.weight", [D], False, kind)
def mlp(p, kind):
    add(p + "mlp.gate_proj.weight", [I, H], True, kind)
    add(p + "mlp.up_proj.weight", [I, H], True, kind)
    add(p + "mlp.down_proj.weight", [H, I], True, kind)

add(P + "embed_tokens.weight", [V, H], True)
add(P + "norm.weight", [H], False)
add("language_model.lm_head.weight", [V, H], True)
C = 2 * HK * DK + HV * DV
for i in range(LAYERS):
    p = P + "layers.%d." % i
    add(p + "input_layernorm.weight", [H], False)
    add(p + "post_attention_layernorm.weight", [H], False)
    if (i + 1) % 4 == 0:
        attention(p, "text")
    else:
        a = p + "linear_attn."
        add(a + "in_proj_qkv.weight", [C, H], True)
        add(a + "in_proj_z.weight", [HV * DV, H], True)
        add(a + "in_proj_b.weight", [HV, H], True)
        add(a + "in_proj_a.weight", [HV, H], True)
        add(a + "conv1d.weight", [C, K, 1], False)
        add(a + "A_log", [HV], False)
        add(a + "dt_bias", [HV], False)
        add(a + "norm.weight", [DV], False)
        add(a + "out_proj.weight", [H, HV * DV], True)
    mlp(p, "text")
add("mtp.fc.weight", [H, 2 * H], True, "mtp")
add("mtp.norm.weight", [H], False, "mtp")
attention("mtp.layers.0.", "mtp")
mlp("mtp.layers.0.", "mtp")
vision = [("vision_tower.blocks.0.attn.qkv.weight", "BF16", [12, 4]),
          ("vision_tower.patch_embed.proj.weight", "BF16", [4, 4])]

size = {"BF16": 2, "U32": 4}
header, offset, nbytes = {"__metadata__": {"format": "mlx"}}, 0, {"text": 0, "mtp": 0}
for name, dt, shape in tensors + vision:
    n = prod(shape) * size[dt]
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
    offset += n
    if not name.startswith("vision_tower"):
        nbytes["mtp" if name.startswith("mtp.") else "text"] += n
h = json.dumps(header).encode()
rng = random.Random(7)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + bytes(rng.getrandbits(8) for _ in range(offset)))
open(os.path.join(out, "tokenizer.json"), "w").write("{}")
open(os.path.join(out, "chat_template.jinja"), "w").write("{{ messages }}")

full, linear = LAYERS // 4, LAYERS - LAYERS // 4
kv = full * 2 * KV * D * 4
gdn = linear * ((K - 1) * C + HV * DK * DV) * 4
expected = {"model_type": "qwen3_5", "moe": False, "hidden_size": H, "num_layers": LAYERS,
            "layer_pattern": "LLLF x 2", "params": params["text"], "mtp_params": params["mtp"],
            "weight_bytes": nbytes["text"], "mtp_weight_bytes": nbytes["mtp"],
            "mtp_tensors": sum(1 for t in tensors if t[0].startswith("mtp.")),
            "vision_tensors_skipped": 2, "tokenizer_json": True, "chat_template": True,
            "kv_bytes_per_token": kv, "gdn_state_bytes_per_sequence": gdn, "context": 1000,
            "cache_bytes_per_sequence": kv * 1000 + gdn, "layout": "mlx",
            "norms_stored_plus_one": True}
json.dump(expected, open(os.path.join(out, "..", "expected.json"), "w"))
EOF

fail() { echo "FAIL: $*" >&2; exit 1; }

text=$("$BIN" inspect "$TMP/model" --context 1000)
echo "$text"
for want in "qwen3_5 (dense), hidden 128, 8 layers" "LLLF x 2 (6 linear attention, 2 full attention)" \
            "quantization:         affine q4 g64 default, 2 overrides" "affine q8 g64  34.0 KiB (1 tensors)" \
            "tokenizer.json:       present" "chat template:        present" "at context 1000" \
            "vision tensors:       2 (skipped)" "mlx (norms stored as 1+w)"; do
  grep -qF -- "$want" <<<"$text" || fail "inspect output lacks '$want'"
done

"$BIN" inspect "$TMP/model" --json --context 1000 >"$TMP/got.json"
$PY - "$TMP/got.json" "$TMP/expected.json" <<'EOF'
import json, sys
got, exp = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bad = {k: (got.get(k), v) for k, v in exp.items() if got.get(k) != v}
if bad:
    sys.exit("inspect --json differs (got, expected): %r" % bad)
formats = {f["format"]: f for f in got["bytes_by_format"]}
assert set(formats) == {"bf16", "affine q4 g64", "affine q8 g64"}, formats
assert formats["affine q8 g64"]["tensors"] == 1, formats
assert sum(f["bytes"] for f in formats.values()) == exp["weight_bytes"] + exp["mtp_weight_bytes"]
q = got["quantization"]
assert (q["bits"], q["group_size"], q["overrides"]) == (4, 64, 2), q
EOF

# Broken directories: exit status 1 and exactly one line "error: ..." naming the problem.
expect_error() {  # dir, text the message must contain
  set +e
  "$BIN" inspect "$1" >"$TMP/out" 2>"$TMP/err"
  rc=$?
  set -e
  [ "$rc" = 1 ] || fail "inspect $1: exit $rc, expected 1"
  [ "$(wc -l <"$TMP/err")" = 1 ] || fail "inspect $1: stderr is not one line: $(cat "$TMP/err")"
  grep -q "^error: .*$2" "$TMP/err" || fail "inspect $1: '$(cat "$TMP/err")' lacks '$2'"
  [ ! -s "$TMP/out" ] || fail "inspect $1 printed to stdout"
}
mkdir "$TMP/empty"
expect_error "$TMP/empty" "no config.json"
expect_error "$TMP/missing" "not a directory"
mkdir "$TMP/trunc"
cp "$TMP/model/config.json" "$TMP/trunc/"
head -c 5000 "$TMP/model/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_error "$TMP/trunc" "model.safetensors.*truncated"
echo "PASS"
