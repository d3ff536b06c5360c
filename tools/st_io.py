#!/usr/bin/env python3
"""Minimal safetensors reader/writer (numpy + torch, no safetensors package needed), and the
sharded Hugging Face layout (model-0000k-of-0000n.safetensors + model.safetensors.index.json).

Format (MODEL-SPEC D): u64 LE header length N, N bytes of JSON (space padded to a multiple of 8
here), then the data buffer; data_offsets are relative to the buffer start.
"""

import json
import os
import struct

import numpy as np
import torch

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U32": np.uint32,
       "U16": np.uint16, "BOOL": np.bool_}
_TORCH_TO_ST = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _encode(t):
    """-> (dtype string, shape, bytes) for a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        a = np.ascontiguousarray(t)
        for k, v in _NP.items():
            if a.dtype == np.dtype(v):
                return k, list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        raise ValueError("unsupported numpy dtype %s" % a.dtype)
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        bits = (t.float().numpy().view(np.uint32) >> 16).astype("<u2")  # exact: bf16 -> f32 -> top 16 bits
        return "BF16", list(t.shape), bits.tobytes()
    if t.dtype not in _TORCH_TO_ST:
        raise ValueError("unsupported torch dtype %s" % t.dtype)
    return _TORCH_TO_ST[t.dtype], list(t.shape), t.numpy().astype(
        t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()


def save_file(tensors, path, metadata=None):
    """tensors: dict name -> torch.Tensor | np.ndarray (insertion order kept)."""
    header = {}
    blobs = []
    off = 0
    for name, t in tensors.items():
        dt, shape, raw = _encode(t)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n).decode("utf-8")), 8 + n


def load_file(path, as_numpy=False):
    """-> dict name -> torch.Tensor (BF16 as torch.bfloat16) or numpy (BF16 as float32)."""
    header, base = read_header(path)
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b: base + e]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            a = a.reshape(shape)
            out[name] = a.copy() if as_numpy else torch.from_numpy(a.copy()).to(torch.bfloat16)
        else:
            a = np.frombuffer(raw, dtype=np.dtype(_NP[info["dtype"]]).newbyteorder("<")).reshape(shape)
            if as_numpy:
                out[name] = a.copy()
            elif info["dtype"] in ("U16", "U32", "U64"):  # torch lacks most unsigned types: widen
                out[name] = torch.from_numpy(a.astype(np.int64))
            else:
                out[name] = torch.from_numpy(a.astype(a.dtype.newbyteorder("=")))
    return out


def save_sharded(tensors, out_dir, max_shard_bytes, metadata=None, prefix="model"):
    """Writes prefix.safetensors when everything fits in one shard, else
    prefix-0000k-of-0000n.safetensors plus prefix.safetensors.index.json. Tensors are packed in
    order; a shard closes before the tensor that would overflow it. Returns the file names."""
    sizes = {k: len(_encode(v)[2]) for k, v in tensors.items()}
    groups, cur, cur_bytes = [], [], 0
    for k in tensors:
        if sizes[k] > max_shard_bytes:
            raise ValueError("tensor %s (%d bytes) exceeds the shard limit %d" % (k, sizes[k], max_shard_bytes))
        if cur and cur_bytes + sizes[k] > max_shard_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(k)
        cur_bytes += sizes[k]
    if cur:
        groups.append(cur)
    os.makedirs(out_dir, exist_ok=True)
    if len(groups) == 1:
        name = prefix + ".safetensors"
        save_file({k: tensors[k] for k in groups[0]}, os.path.join(out_dir, name), metadata)
        return [name]
    names, weight_map = [], {}
    for i, g in enumerate(groups):
        name = "%s-%05d-of-%05d.safetensors" % (prefix, i + 1, len(groups))
        save_file({k: tensors[k] for k in g}, os.path.join(out_dir, name), metadata)
        names.append(name)
        for k in g:
            weight_map[k] = name
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    with open(os.path.join(out_dir, prefix + ".safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return names + [prefix + ".safetensors.index.json"]


def load_dir(model_dir, as_numpy=False):
    """All tensors of a model directory (single file or index + shards)."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        out.update(load_file(os.path.join(model_dir, fn), as_numpy=as_numpy))
    return out
