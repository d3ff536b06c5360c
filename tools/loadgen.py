#!/usr/bin/env python3
"""Load generator for the HTTP API (Python standard library only, so it runs wherever python3
does): N concurrent streaming chat completions (greedy, ignore_eos, a fixed number of tokens
each), per-stream decode rate and time to first token, aggregate tokens per second; then the
time to first token of a long prompt, idle and while N streams decode. Prints a table and
writes JSON.

    tools/loadgen.py --url http://127.0.0.1:8000 --key KEY --model NAME \\
        [--streams 1,16,64] [--max-tokens 256] [--long-prompt-words 700] [--busy-streams N] \\
        [--json out.json]

--busy-streams: streams decoding while the long prompt's TTFT is measured (default: the most).
tools/http_vs_engine.sh runs it next to `tokenmill bench` on the same model.
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse


def stream(opt, prompt, max_tokens):
    """One streaming request; times are seconds on the shared monotonic clock."""
    url = urllib.parse.urlparse(opt.url)
    body = json.dumps({
        "model": opt.model, "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False}})
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", "authorization": f"Bearer {opt.key}"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"loadgen: HTTP {resp.status}: {resp.read()[:500]!r}")
    first, tokens, prompt_tokens = None, 0, 0
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            prompt_tokens = chunk["usage"]["prompt_tokens"]
        choices = chunk.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        if first is None and (delta.get("content") or delta.get("reasoning_content")):
            first = time.monotonic()
    conn.close()
    end = time.monotonic()
    return {"start": t0, "first": first if first is not None else end, "end": end,
            "tokens": tokens, "prompt_tokens": prompt_tokens}


def run_concurrent(opt, n, prompt, max_tokens):
    results = [None] * n

    def one(i):
        results[i] = stream(opt, prompt, max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r is None for r in results):
        raise SystemExit("loadgen: a stream failed (see the error above)")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--key", default="none")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--long-prompt-words", type=int, default=700)
    ap.add_argument("--busy-streams", type=int, default=0)
    ap.add_argument("--json", default="")
    opt = ap.parse_args()
    counts = [int(x) for x in opt.streams.split(",")]

    short_prompt = "Write a long story about a lighthouse keeper."
    long_prompt = " ".join(f"word{i % 97}" for i in range(opt.long_prompt_words))
    results = {"url": opt.url, "model": opt.model, "max_tokens": opt.max_tokens, "streams": []}
    stream(opt, short_prompt, 8)  # warm-up: recordings, caches
    for n in counts:
        runs = run_concurrent(opt, n, short_prompt, opt.max_tokens)
        per_stream = [(r["tokens"] - 1) / max(r["end"] - r["first"], 1e-9) for r in runs]
        first_all = min(r["first"] for r in runs)
        end_all = max(r["end"] for r in runs)
        total = sum(r["tokens"] for r in runs)
        entry = {"streams": n, "aggregate_tok_s": total / max(end_all - first_all, 1e-9),
                 "per_stream_tok_s_mean": sum(per_stream) / n,
                 "ttft_s_mean": sum(r["first"] - r["start"] for r in runs) / n, "tokens": total}
        results["streams"].append(entry)
        print(f"streams {n:3d}: aggregate {entry['aggregate_tok_s']:.1f} tok/s, per stream "
              f"{entry['per_stream_tok_s_mean']:.2f} tok/s, mean TTFT {entry['ttft_s_mean']:.3f} s",
              flush=True)

    # A long prompt's time to first token, idle and while `busy` streams decode.
    idle = stream(opt, long_prompt, 1)
    busy_n = opt.busy_streams or max(counts)
    background = []
    bg = threading.Thread(target=lambda: background.extend(
        run_concurrent(opt, busy_n, short_prompt, opt.max_tokens)))
    bg.start()
    time.sleep(0.5)  # let them reach decode
    busy = stream(opt, long_prompt, 1)
    bg.join()
    lp = {"words": opt.long_prompt_words, "prompt_tokens": idle["prompt_tokens"],
          "ttft_idle_s": idle["first"] - idle["start"], "ttft_busy_s": busy["first"] - busy["start"],
          "busy_streams": busy_n}
    results["long_prompt"] = lp
    print(f"long prompt ({lp['prompt_tokens']} tokens) TTFT: idle {lp['ttft_idle_s']:.3f} s, with "
          f"{busy_n} streams decoding {lp['ttft_busy_s']:.3f} s "
          f"({lp['ttft_busy_s'] / lp['ttft_idle_s']:.2f}x)")
    if opt.json:
        with open(opt.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
