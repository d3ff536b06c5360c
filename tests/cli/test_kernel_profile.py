#!/usr/bin/env python3
"""tools/kernel_profile.py on an ncu-shaped CSV written here: the step between the last two
embedding launches is aggregated by kernel name (template arguments and namespaces dropped),
with launch counts, totals and shares; a file with one step is refused with a message."""
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                    "kernel_profile.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"\n')


def row(i, name, ns):
    return (f'"{i}","1","tokenmill","h","{name}","1","13","(128, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","ns","{ns:,}"\n')


def write(path, kernels):
    with open(path, "w") as f:
        f.write("==PROF== Connected to process 1\n" + HEADER)
        for i, (name, ns) in enumerate(kernels):
            f.write(row(i, name, ns))


def run(path):
    return subprocess.run([sys.executable, TOOL, path], capture_output=True, text=True)


embed = "tokenmill::<unnamed>::embed_kernel(tokenmill::DevMat, const int *, float *)"
gemv = "void tokenmill::<unnamed>::q4d_gemv_kernel<64, 1, 2, 2>(tokenmill::GemvJobs, long)"
norm = "tokenmill::<unnamed>::add_rmsnorm_vec_kernel(float *, const float *, int, float)"
step1 = [(embed, 10000), (gemv, 999), (norm, 5)]  # the first step: not the one shown
step2 = [(embed, 2000), (gemv, 3000), (gemv, 3000), (norm, 2000)]
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "prof.csv")
    write(p, step1 + step2 + [(embed, 7)])
    r = run(p)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    by_name = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert by_name["q4d_gemv_kernel"][1:] == ["2", "6.0", "3.00", "60.0%"], lines
    assert by_name["add_rmsnorm_vec_kernel"][1:] == ["1", "2.0", "2.00", "20.0%"], lines
    assert by_name["embed_kernel"][1:] == ["1", "2.0", "2.00", "20.0%"], lines
    assert lines[-1].startswith("step: 4 kernels, 10.0 us of kernel time (3 steps"), lines[-1]

    write(p, step1)
    r = run(p)
    assert r.returncode != 0 and "fewer than two 'embed_kernel' launches" in r.stderr, r
print("kernel_profile: ok")
