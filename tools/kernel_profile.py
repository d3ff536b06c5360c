#!/usr/bin/env python3
"""Per-kernel breakdown of one decode step from an ncu CSV (Python standard library only).

    ncu --graph-profiling node --clock-control none --cache-control none --csv \\
        --print-units base --metrics gpu__time_duration.sum \\
        tokenmill bench --dummy-weights --device cuda --preset qwen3.5-27b --quant q4g64 \\
        --prompt-lengths 32 --contexts 64 --batches 1 --decode-tokens 3 > prof.csv
    tools/kernel_profile.py prof.csv [--marker embed_kernel] [--top 25]

A decode step starts with the token embedding (--marker): the kernels from the second-to-last
marker up to the last one are the step that ran in graph replay before the bench's final
step. Prints launches, total and mean microseconds and the share of the step per kernel name
(template arguments and parameter lists dropped), then the step's kernel count and summed
kernel time. ncu runs each kernel alone, so the sum leaves out the gaps between kernels and
what overlapped; with --clock-control none the durations are at the clocks the GPU chose.
tools/gpu_test.sh runs this as its `profile` stage.
"""
import argparse
import collections
import csv
import re
import sys


def kernel_rows(path):
    """(kernel name, duration in ns) for each profiled kernel, in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        sys.exit(f"{path}: no CSV rows (did ncu run with --csv?)")
    try:
        name_col = header.index("Kernel Name")
        metric_col = header.index("Metric Name")
        value_col = header.index("Metric Value")
    except ValueError:
        sys.exit(f"{path}: expected columns Kernel Name, Metric Name, Metric Value")
    rows = []
    for r in reader:
        if r[metric_col] != "gpu__time_duration.sum":
            continue
        rows.append((r[name_col], float(r[value_col].replace(",", ""))))
    return rows


def short_name(name):
    """The kernel's function name without namespaces, template arguments or parameters."""
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*$", "", name)  # parameter list
    depth, out = 0, []
    for ch in name:  # template arguments, nested
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).split("::")[-1]
    return name.replace("void ", "").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--marker", default="embed_kernel", help="kernel that starts a step")
    ap.add_argument("--top", type=int, default=25, help="kernel names to list")
    args = ap.parse_args()
    rows = kernel_rows(args.csv)
    starts = [i for i, (n, _) in enumerate(rows) if short_name(n) == args.marker]
    if len(starts) < 2:
        sys.exit(f"{args.csv}: fewer than two '{args.marker}' launches: no whole step to show")
    step = rows[starts[-2]:starts[-1]]
    total = sum(d for _, d in step)
    agg = collections.defaultdict(lambda: [0, 0.0])
    for n, d in step:
        a = agg[short_name(n)]
        a[0] += 1
        a[1] += d
    print(f"{'kernel':<40} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>7}")
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][1])
    for name, (count, ns) in ranked[: args.top]:
        print(f"{name[:40]:<40} {count:>8} {ns / 1e3:>10.1f} {ns / count / 1e3:>9.2f} "
              f"{100 * ns / total:>6.1f}%")
    rest = ranked[args.top:]
    if rest:
        ns = sum(v[1] for _, v in rest)
        print(f"{'(' + str(len(rest)) + ' more)':<40} {sum(v[0] for _, v in rest):>8} "
              f"{ns / 1e3:>10.1f} {'':>9} {100 * ns / total:>6.1f}%")
    print(f"step: {len(step)} kernels, {total / 1e3:.1f} us of kernel time "
          f"({len(starts)} steps in the file)")


if __name__ == "__main__":
    main()
