"""(Copied unchanged from shared/models/training/st_io.py.)

Minimal safetensors writer/reader (float32 only is needed here; F16/BF16/I32/I64 supported).

Format: 8-byte little-endian u64 header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
padded with spaces to a multiple of 8, then the raw little-endian tensor bytes.
"""
import json
import struct

import numpy as np
import torch

_DT = {torch.float32: ("F32", np.float32), torch.float16: ("F16", np.float16),
       torch.int32: ("I32", np.int32), torch.int64: ("I64", np.int64)}
_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def save_file(tensors, path, metadata=None):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        code, npdt = _DT[t.dtype]
        b = t.numpy().astype(np.dtype(npdt).newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {str(k): str(v) for k, v in (metadata or {}).items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=np.dtype(_NP[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.astype(_NP[info["dtype"]]).reshape(info["shape"]).copy())
    return out, meta
