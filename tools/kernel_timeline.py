#!/usr/bin/env python3
"""Timeline of decode steps from a kernel trace (Python standard library only).

    CUDA_INJECTION64_PATH=build-gpu/tools/kernel_trace/libtm_kernel_trace.so \\
    TM_KERNEL_TRACE=trace.csv tokenmill bench --dummy-weights --device cuda \\
        --preset qwen3.5-27b --quant q4g64 --prompt-lengths 32 --contexts 1024 --batches 1 \\
        --decode-tokens 16
    tools/kernel_timeline.py trace.csv [--marker embed_kernel] [--steps 8] [--show 40]
    tools/kernel_timeline.py trace.csv --longest --steps 1    # a prompt's prefill step

The trace (tools/kernel_trace) holds each kernel's start and end on the GPU clock with no
serialization, so it shows what a replayed step really costs. A step starts at a --marker
launch; the last --steps whole steps are summarized. Per kernel name: launches per step, mean
duration, and the mean *increment*, how far the kernel moved the step's latest end (its share of
the step's critical path: with dependent launches a kernel starts before its predecessor ends
and waits, so its duration overstates its cost). Then the first --show kernels of the last step
with start and end relative to the step's start, and the gap to the previous kernel's end
(negative: overlapped). tools/gpu_test.sh runs this as its `timeline` stage.
"""
import argparse
import collections
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_profile import short_name  # noqa: E402


def read_trace(path):
    """(start_ns, end_ns, grid, block, name) per kernel, sorted by start."""
    with open(path, newline="", errors="replace") as f:
        rows = [(int(r["start_ns"]), int(r["end_ns"]), int(r["grid"]), int(r["block"]),
                 r["name"]) for r in csv.DictReader(f)]
    if not rows:
        sys.exit(f"{path}: no kernels (did the traced program use the GPU?)")
    rows.sort()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--marker", default="embed_kernel", help="kernel that starts a step")
    ap.add_argument("--steps", type=int, default=8, help="whole steps to average, the last ones")
    ap.add_argument("--longest", action="store_true",
                    help="the --steps longest whole steps instead of the last ones (a prompt's "
                         "prefill among the short decode steps of a bench run)")
    ap.add_argument("--show", type=int, default=40, help="kernels of the last step to list")
    ap.add_argument("--tail", type=int, default=12, help="last rows of the last step to list")
    ap.add_argument("--top", type=int, default=20, help="kernel names to list")
    args = ap.parse_args()
    rows = read_trace(args.csv)
    marks = [i for i, r in enumerate(rows) if short_name(r[4]) == args.marker]
    if len(marks) < 2:
        sys.exit(f"{args.csv}: fewer than two '{args.marker}' launches: no whole step")
    bounds = list(zip(marks[:-1], marks[1:]))
    if args.longest:
        bounds = sorted(sorted(bounds, key=lambda ab: rows[ab[1]][0] - rows[ab[0]][0])[-args.steps:])
    else:
        bounds = bounds[-args.steps:]
    walls, kernel_ns, incr_ns, between_ns = [], [], [], []
    per = collections.defaultdict(lambda: [0, 0, 0])  # launches, duration ns, increment ns
    for a, b in bounds:
        step = rows[a:b]
        t0 = step[0][0]
        walls.append(rows[b][0] - t0)
        latest = t0
        k_sum = i_sum = 0
        for start, end, _, _, name in step:
            incr = max(0, end - latest)
            latest = max(latest, end)
            p = per[short_name(name)]
            p[0] += 1
            p[1] += end - start
            p[2] += incr
            k_sum += end - start
            i_sum += incr
        kernel_ns.append(k_sum)
        incr_ns.append(i_sum)
        # The GPU idles between a step's last kernel end and the next step's first kernel: the
        # host's part of a step (scheduling, uploads, reading back the sampled ids).
        between_ns.append(max(0, rows[b][0] - latest))
    n = len(bounds)
    wall = statistics.mean(walls)
    print(f"{n} steps: {statistics.mean(b - a for a, b in bounds):.0f} kernels, wall "
          f"{wall / 1e3:.1f} us (min {min(walls) / 1e3:.1f}), kernel time "
          f"{statistics.mean(kernel_ns) / 1e3:.1f} us, critical path "
          f"{statistics.mean(incr_ns) / 1e3:.1f} us, idle {(wall - statistics.mean(incr_ns)) / 1e3:.1f} us"
          f" (between steps {statistics.mean(between_ns) / 1e3:.1f} us)")
    print(f"{'kernel':<36} {'per step':>8} {'mean us':>8} {'incr us':>8} {'incr/step':>10} {'share':>6}")
    ranked = sorted(per.items(), key=lambda kv: -kv[1][2])
    for name, (count, dur, incr) in ranked[: args.top]:
        print(f"{name[:36]:<36} {count / n:>8.1f} {dur / count / 1e3:>8.2f} "
              f"{incr / count / 1e3:>8.2f} {incr / n / 1e3:>10.1f} {100 * incr / n / wall:>5.1f}%")
    a, b = bounds[-1]
    t0 = rows[a][0]
    print(f"\nlast step, its last {args.tail} rows and the next step's first (us from its start):")
    for start, end, grid, block, name in rows[max(a, b - args.tail):b + 1]:
        print(f"{(start - t0) / 1e3:>9.2f} {(end - t0) / 1e3:>9.2f} {(end - start) / 1e3:>7.2f} "
              f"{grid:>8}  {short_name(name)[:60]}")
    prev_end = t0
    print(f"\nlast step, first {args.show} kernels (us from the step's start):")
    print(f"{'start':>9} {'end':>9} {'dur':>7} {'gap':>7} {'grid':>6}  kernel")
    for start, end, grid, block, name in rows[a:min(b, a + args.show)]:
        print(f"{(start - t0) / 1e3:>9.2f} {(end - t0) / 1e3:>9.2f} {(end - start) / 1e3:>7.2f} "
              f"{(start - prev_end) / 1e3:>7.2f} {grid:>6}  {short_name(name)[:60]}")
        prev_end = max(prev_end, end)


if __name__ == "__main__":
    main()
