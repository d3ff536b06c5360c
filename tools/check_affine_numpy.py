#!/usr/bin/python3
"""Independent numpy implementation of MLX's affine quantizer (MODEL-SPEC section A), written from
the spec, producing the fixture tests/unit/tensor/affine_numpy_fixture.txt that the C++ quantizer
(src/tensor/affine.cpp) must reproduce bit for bit.

  /usr/bin/python3 tools/check_affine_numpy.py            # check the committed fixture is what this makes
  /usr/bin/python3 tools/check_affine_numpy.py --write    # regenerate it

Fixture format (text, one record per line, all floats as IEEE-754 F32 bit patterns in hex):
  input ROWS COLS <rows*cols words>
  case BITS GROUP
  packed <words> / scales <words> / biases <words>
"""
import argparse
import os
import sys

import numpy as np

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "unit", "tensor",
                       "affine_numpy_fixture.txt")
ROWS, COLS = 8, 256


def make_input():
    rng = np.random.default_rng(20240531)
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    w[0, :] = np.float32(0.5)                      # constant rows: range 0 -> eps scale
    w[1, :] = np.float32(0.0)                      # zero row: q0 == 0 -> bias 0
    w[2, :] = -np.abs(w[2, :]) * np.float32(3.0)   # all negative: |min| dominates
    w[3, :] = np.abs(w[3, :]) * np.float32(0.01)   # all positive, small
    w[4, :] = w[4, :] * np.float32(1e-6)           # tiny range, near the eps clamp
    w[5, 0:128] = np.round(w[5, 0:128] * 4) / 4    # repeated values (rounding ties possible)
    w[6, :] = w[6, :] * np.float32(100.0)
    return w.astype(np.float32)


def quantize(w, bits, group):
    """MLX affine quantize in float32 arithmetic; returns (q uint8 [rows, cols], scales, biases)."""
    f = np.float32
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    hi = g.max(axis=-1, keepdims=True)
    lo = g.min(axis=-1, keepdims=True)
    n_bins = f((1 << bits) - 1)
    lo_edge = np.abs(lo) > np.abs(hi)
    s = np.maximum((hi - lo) / n_bins, f(1e-7)).astype(np.float32)
    s = np.where(lo_edge, s, -s).astype(np.float32)
    edge = np.where(lo_edge, lo, hi).astype(np.float32)
    q0 = np.round(edge / s).astype(np.float32)     # numpy rounds half to even, like MLX
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(nz, edge / q0, s).astype(np.float32)
    b = np.where(nz, edge, f(0)).astype(np.float32)
    q = np.clip(np.round((g - b) / s), f(0), n_bins).astype(np.uint8)
    return q.reshape(rows, cols), s.reshape(rows, -1), b.reshape(rows, -1)


def pack(q, bits):
    """Each row as one little-endian bit stream (element j at bits [j*bits, (j+1)*bits))."""
    rows, cols = q.shape
    words = cols * bits // 32
    out = np.zeros((rows, words), dtype=np.uint32)
    for r in range(rows):
        stream = 0
        for j in range(cols):
            stream |= int(q[r, j]) << (j * bits)
        for k in range(words):
            out[r, k] = (stream >> (32 * k)) & 0xFFFFFFFF
    return out


def hexwords(a, dtype):
    return " ".join(f"{int(x):08x}" for x in np.ascontiguousarray(a).view(dtype).ravel())


def render():
    w = make_input()
    lines = [f"input {ROWS} {COLS} " + hexwords(w, np.uint32)]
    for bits in (2, 3, 4, 5, 6, 8):
        for group in (32, 64, 128):
            q, s, b = quantize(w, bits, group)
            lines.append(f"case {bits} {group}")
            lines.append("packed " + hexwords(pack(q, bits), np.uint32))
            lines.append("scales " + hexwords(s.astype(np.float32), np.uint32))
            lines.append("biases " + hexwords(b.astype(np.float32), np.uint32))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite the fixture")
    args = ap.parse_args()
    text = render()
    if args.write:
        with open(FIXTURE, "w") as fh:
            fh.write(text)
        print(f"wrote {FIXTURE} ({len(text)} bytes)")
        return 0
    with open(FIXTURE) as fh:
        if fh.read() != text:
            print("fixture differs from what this script produces; rerun with --write", file=sys.stderr)
            return 1
    print("fixture up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
