#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Writes the seed corpora in fuzz/seeds/<target>/ from the shipped files (data/) and small
# hand-made examples of each format. Run from the repository root: python3 fuzz/make_seeds.py
# (standard library only; the seeds are committed, so this only reruns when a format changes).
import json
import os
import struct

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "fuzz", "seeds")


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    """tensors: name -> (dtype, shape, raw bytes); returns the file's bytes."""
    header, data = {}, b""
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda v: struct.pack("<%df" % len(v), *v)
i32 = lambda v: struct.pack("<%di" % len(v), *v)

# ---- safetensors: small files of every dtype, and the shipped models' headers on little data
put("safetensors", "all_dtypes.safetensors", safetensors({
    "a.f32": ("F32", [2, 3], f32([0.5, -1, 2, 3e-8, 1e30, -0.0])),
    "b.f16": ("F16", [4], struct.pack("<4H", 0x3c00, 0x7c00, 0x0001, 0xfc00)),
    "c.bf16": ("BF16", [2], struct.pack("<2H", 0x3f80, 0x7fc0)),
    "d.i32": ("I32", [3], i32([1, -2, 2**31 - 1])),
    "e.f64": ("F64", [1], struct.pack("<d", 1.5)),
    "scalar": ("F32", [], f32([7])),
    "empty": ("F32", [0, 4], b""),
}, {"format": "pt", "note": "seed"}))
for model in ("tiny-recall", "recall-8kv"):
    with open(os.path.join(root, "data", model, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    # the real header (names, dtypes, shapes), each tensor cut to its first 4 elements
    small = {}
    for name, e in sorted(header.items())[:12]:
        if name == "__metadata__":
            continue
        size = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4}.get(e["dtype"], 1)
        small[name] = (e["dtype"], [4], bytes(range(4 * size)))
    put("safetensors", model + ".header.safetensors", safetensors(small, header.get("__metadata__")))

# ---- eval prompts JSONL: the first lines of the shipped files (prompts cut short) and edge cases
for name in ("chain", "passkey"):
    with open(os.path.join(root, "data", "eval", name + ".jsonl")) as f:
        lines = [json.loads(l) for l in f.read().splitlines()[:2] if l.strip()]
    for l in lines:
        l["prompt"] = l["prompt"][:200]
    put("eval_jsonl", name + ".jsonl", "\n".join(json.dumps(l) for l in lines) + "\n")
put("eval_jsonl", "minimal.jsonl",
    '{"id": "x", "task": "t", "prompt": "p", "answer": "a", "context_len": 12, "depth": 0.5}\n\n'
    '{"id": "y", "task": "t", "prompt": "", "answer": ""}\n')

# ---- head-roles files (docs/calibration.md): one per method, 2 layers, 2 KV heads
model = {"layers": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 8, "config_hash": ""}
head = {"format": "kvsift-head-roles", "version": 1, "model": model, "parameters": {"k": 1}}
put("roles_file", "synckv.json", json.dumps(dict(head, method="synckv", layers=[
    {"assign": [0, 0], "representatives": [1], "similarity": [[1, 0.5], [0.5, 1]]},
    {"assign": [0, 1], "representatives": [0, 1]}]), indent=1))
put("roles_file", "heterocache.json", json.dumps(dict(head, method="heterocache", layers=[
    {"roles": [2, 3], "leader": [0, 0], "stability": [0.1, 0.9], "similarity": [[1, 0.2], [0.2, 1]]},
    {"roles": [0, 1], "leader": [-1, -1], "stability": [0.5, 0.5]}]), indent=1))

# ---- calibration trace (examples/kvsift/calibration_trace.hpp): 1 prompt, L=1, Hq=2, H=1, d=2
n, W, T, L, Hq, H, d = 3, 2, 1, 1, 2, 1, 2
kv = [0.25 * i for i in range(L * (n + T) * H * d)]
put("calibration_trace", "one_prompt.safetensors", safetensors({
    "p0.keys": ("F32", [L, n + T, H, d], f32(kv)),
    "p0.values": ("F32", [L, n + T, H, d], f32(kv)),
    "p0.queries": ("F32", [L, W + T, Hq, d], f32([1.0] * (L * (W + T) * Hq * d))),
    "p0.ids": ("I32", [n + T], i32([1, 2, 3, 4])),
    "p0.prompt_len": ("I32", [1], i32([n])),
    "p0.window": ("I32", [1], i32([W])),
    "p0.steps": ("I32", [1], i32([T])),
}, {"format": "kvsift-calibration-trace", "version": "1", "layers": str(L), "q_heads": str(Hq),
    "kv_heads": str(H), "head_dim": str(d), "prompts": "1", "config_hash": ""}))
