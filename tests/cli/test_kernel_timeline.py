#!/usr/bin/env python3
"""tools/kernel_timeline.py on a trace written here in tools/kernel_trace's CSV form: the last
whole step (between the last two embedding launches) is summarized by kernel name, with each
kernel's increment of the step's latest end (its share of the critical path, overlaps not
counted twice), the step's wall, kernel and idle time (and the part of it between the step's last
end and the next step's first launch), the step's last rows with the next step's first, and the
gap of a dependent launch that started before its predecessor ended; --longest takes the
longest steps (a prompt's) instead of the last; a trace without two steps is refused with a
message."""
import csv
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                    "kernel_timeline.py")
NS = "tokenmill::cuda::(anonymous namespace)::"
embed = f"{NS}embed_kernel(tokenmill::cuda::DevMat, const int*, float*)"
gemv = f"void {NS}q4d_gemv_kernel<64, 1, 2, 2, false>(tokenmill::cuda::GemvJobs, int)"
norm = f"void {NS}rmsnorm_q4d_kernel(float*, const float*, long, float)"


def write(path, kernels):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_MINIMAL)
        w.writerow(["start_ns", "end_ns", "graph_id", "graph_node", "stream", "grid", "block",
                    "shared_bytes", "name"])
        for start, end, name in kernels:
            w.writerow([start, end, 1, 7, 13, 132, 128, 0, name])


def run(path, *args):
    return subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True)


step1 = [(0, 1000, embed), (500, 3000, gemv), (3200, 4000, norm)]
# The gemvs start before their predecessors end (dependent launches); 10 us from marker to marker.
step2 = [(10000, 10500, embed), (10400, 12500, gemv), (12000, 14000, gemv), (14100, 14600, norm)]
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "trace.csv")
    write(p, step1 + step2 + [(20000, 20100, embed)])
    r = run(p, "--steps", "1", "--show", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("1 steps: 4 kernels, wall 10.0 us (min 10.0), kernel time 5.1 us, "
                        "critical path 4.6 us, idle 5.4 us (between steps 5.4 us)"), lines[0]
    by_name = {line.split()[0]: line.split() for line in lines[2:5]}
    assert by_name["q4d_gemv_kernel"][1:] == ["2.0", "2.05", "1.75", "3.5", "35.0%"], lines
    assert by_name["rmsnorm_q4d_kernel"][1:] == ["1.0", "0.50", "0.60", "0.6", "6.0%"], lines
    assert by_name["embed_kernel"][1:] == ["1.0", "0.50", "0.50", "0.5", "5.0%"], lines
    tail = lines.index(next(x for x in lines if x.startswith("last step, its last")))
    first = lines.index(next(x for x in lines if x.startswith("last step, first")))
    # The step's rows (start, end, duration, grid) and the next step's marker, 10 us in.
    assert [x.split()[0] for x in lines[tail + 1:first] if x] == \
        ["0.00", "0.40", "2.00", "4.10", "10.00"], lines[tail:first]
    listed = [x.split() for x in lines[first:] if x.endswith("q4d_gemv_kernel")]
    assert listed[0][:4] == ["0.40", "2.50", "2.10", "-0.10"], listed

    r = run(p, "--steps", "2")
    assert r.returncode == 0, r.stderr
    # Means over both steps: kernel time (4.3 + 5.1) / 2, critical path (4.0 + 4.6) / 2.
    assert r.stdout.splitlines()[0].endswith(
        "wall 10.0 us (min 10.0), kernel time 4.7 us, critical path 4.3 us, idle 5.7 us "
        "(between steps 5.7 us)"), r.stdout

    # --longest: a prompt's long step among short decode steps after it.
    prompt = [(0, 1000, embed), (500, 30000, gemv)]
    decode = [(31000, 31500, embed), (31400, 32000, norm), (33000, 33100, embed)]
    write(p, prompt + decode)
    r = run(p, "--steps", "1", "--longest")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (
        "1 steps: 2 kernels, wall 31.0 us (min 31.0), kernel time 30.5 us, critical path "
        "30.0 us, idle 1.0 us (between steps 1.0 us)"), r.stdout
    r = run(p, "--steps", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("1 steps: 2 kernels, wall 2.0 us"), r.stdout

    write(p, step1)
    r = run(p)
    assert r.returncode != 0 and "fewer than two 'embed_kernel' launches" in r.stderr, r
print("kernel_timeline: ok")
