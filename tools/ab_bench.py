#!/usr/bin/env python3
"""A/B decode benchmark: runs `tokenmill bench` for several variants, alternating between them
round after round on the same machine, and prints each variant's mean decode and aggregate
tok/s (at --batch concurrent sequences, 1 by default) with its ratio to the first variant.

Why alternating: two builds measured one after the other drift apart with the device's clocks
and temperature (the same build moves by about 0.5% between runs); interleaved rounds put every
variant through the same conditions, so a 1% difference can be told from noise.

A variant is NAME=SPEC, SPEC being optional ENV=VALUE settings, a tokenmill binary, and optional
extra bench arguments, e.g.

    tools/ab_bench.py --rounds 3 --preset qwen3.5-35b-a3b --preset qwen3.5-27b \\
        main=/tmp/tm_main new=/tmp/tm_new 'new-noprefetch=/tmp/tm_new --no-l2-prefetch'

Each run is `BINARY bench --dummy-weights --device DEVICE --preset P --quant Q --prompt-lengths
32 --contexts CONTEXT --batches BATCH --decode-tokens N` plus the variant's arguments; the
figures come from its --json output ("decode" at the context, the "batch" row's aggregate).
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def parse_variant(text):
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        sys.exit(f"ab_bench: variant '{text}': expected NAME=SPEC (SPEC: [ENV=V ...] BINARY [ARGS])")
    words = shlex.split(spec)
    env = {}
    while words and ENV_RE.match(words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    if not words:
        sys.exit(f"ab_bench: variant '{name}': no tokenmill binary in '{spec}'")
    binary, extra = words[0], words[1:]
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit(f"ab_bench: variant '{name}': '{binary}' is not an executable file")
    return {"name": name, "env": env, "binary": binary, "extra": extra}


def run_once(v, preset, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [v["binary"], "bench", "--dummy-weights", "--device", args.device, "--preset", preset,
               "--quant", args.quant, "--prompt-lengths", "32", "--contexts", str(args.context),
               "--batches", str(args.batch), "--decode-tokens", str(args.decode_tokens), "--json", out,
               "--chart", os.path.join(tmp, "bench.svg")] + v["extra"]
        env = dict(os.environ, **v["env"])
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0 or not os.path.exists(out):
            tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
            sys.exit(f"ab_bench: {v['name']} on {preset} failed (exit {r.returncode}):\n  " +
                     "\n  ".join(tail))
        with open(out) as f:
            d = json.load(f)
    decode = [x["tok_s"] for x in d.get("decode", []) if x.get("context") == args.context]
    batch = [x["aggregate_tok_s"] for x in d.get("batch", []) if x.get("seqs") == args.batch]
    if not decode or not batch:
        sys.exit(f"ab_bench: {v['name']} on {preset}: no decode at {args.context} or batch-"
                 f"{args.batch} row")
    return decode[0], batch[0], d.get("read_gbps", 0.0), d.get("device", "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=[ENV=V ...] BINARY [BENCH ARGS]")
    ap.add_argument("--preset", action="append", help="bench preset (repeatable)")
    ap.add_argument("--quant", default="q4g64")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1, help="concurrent sequences of the aggregate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("ab_bench: --rounds must be at least 1")
    if args.batch < 1:
        sys.exit("ab_bench: --batch must be at least 1")
    presets = args.preset or ["qwen3.5-27b"]
    variants = [parse_variant(t) for t in args.variants]
    if len({v["name"] for v in variants}) != len(variants):
        sys.exit("ab_bench: variant names must differ")

    runs = {(v["name"], p): [] for v in variants for p in presets}
    device, probes = "?", []
    for rnd in range(args.rounds):
        for p in presets:
            for v in variants:
                dec, agg, gbps, dev = run_once(v, p, args)
                device = dev if device == "?" else device
                runs[(v["name"], p)].append((dec, agg))
                probes.append(gbps)
                print(f"round {rnd + 1} {p} {v['name']}: decode {dec:.2f} tok/s, "
                      f"aggregate {agg:.2f}", flush=True)

    print(f"\n{device}; read probe {min(probes):.0f}-{max(probes):.0f} GB/s; "
          f"{args.rounds} rounds, {args.quant}, decode at context {args.context}, "
          f"aggregate at {args.batch} sequences")
    print("| preset | variant | decode tok/s (mean) | vs first | aggregate tok/s (mean) | vs first |")
    print("|---|---|---|---|---|---|")
    for p in presets:
        base = None
        for v in variants:
            r = runs[(v["name"], p)]
            dec = statistics.mean(x[0] for x in r)
            agg = statistics.mean(x[1] for x in r)
            if base is None:
                base = (dec, agg)
            print(f"| {p} | {v['name']} | {dec:.2f} | {100 * (dec / base[0] - 1):+.1f}% | "
                  f"{agg:.2f} | {100 * (agg / base[1] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
