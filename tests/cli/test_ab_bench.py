#!/usr/bin/env python3
"""tools/ab_bench.py against the built tokenmill on the CPU: two variants (the second with an
environment setting and an extra bench argument) over two rounds print one line per run in
alternating order and a table with each variant's means, the first at +0.0%; --batch takes the
aggregate at that many sequences; a spec without a
binary, a binary that does not exist, duplicate names and a bench that fails are refused with
messages naming the variant."""
import os
import re
import subprocess
import sys

BIN = sys.argv[1]
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "ab_bench.py")
COMMON = ["--device", "cpu", "--preset", "cpu-120m", "--context", "64", "--decode-tokens", "4",
          "--rounds", "2"]


def run(*variants, extra=()):
    return subprocess.run([sys.executable, TOOL, *COMMON, *extra, *variants], capture_output=True,
                          text=True, timeout=600)


r = run(f"base={BIN} --threads 2", f"one=TM_AB_BENCH_TEST=1 {BIN} --threads 1")
assert r.returncode == 0, r.stdout + r.stderr
rounds = [line for line in r.stdout.splitlines() if line.startswith("round ")]
assert [line.split()[3].rstrip(":") for line in rounds] == ["base", "one", "base", "one"], rounds
for line in rounds:
    assert re.search(r"decode \d+\.\d\d tok/s, aggregate \d+\.\d\d$", line), line
rows = [line for line in r.stdout.splitlines() if line.startswith("| cpu-120m |")]
assert len(rows) == 2, r.stdout
cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
assert cells[0][1] == "base" and cells[0][3] == "+0.0%" and cells[0][5] == "+0.0%", cells
assert cells[1][1] == "one" and re.fullmatch(r"[+-]\d+\.\d%", cells[1][3]), cells
means = [float(c[2]) for c in cells]
assert all(m > 0 for m in means), cells
assert "2 rounds, q4g64, decode at context 64, aggregate at 1 sequences" in r.stdout, r.stdout

# --batch N: the aggregate comes from the N-sequence row of the same runs.
r = run(f"base={BIN} --threads 2", extra=["--rounds", "1", "--batch", "2"])
assert r.returncode == 0, r.stdout + r.stderr
assert "aggregate at 2 sequences" in r.stdout, r.stdout
row = [line for line in r.stdout.splitlines() if line.startswith("| cpu-120m |")]
assert len(row) == 1 and float(row[0].strip("|").split("|")[4]) > 0, r.stdout

for args, message in [
    (["nobinary"], "variant 'nobinary': expected NAME=SPEC"),
    (["a=/nonexistent/tokenmill"], "variant 'a': '/nonexistent/tokenmill' is not an executable"),
    (["a=TM_X=1"], "variant 'a': no tokenmill binary"),
    ([f"a={BIN}", f"a={BIN}"], "variant names must differ"),
    ([f"bad={BIN} --batches 0"], "bad on cpu-120m failed"),
    ([f"a={BIN}", "--batch", "0"], "--batch must be at least 1"),
]:
    r = run(*args)
    assert r.returncode != 0, args
    assert message in r.stderr, (args, r.stderr)
print("ab_bench: ok")
