#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a PyTorch user would write instead of kvsift's CUDA kernels, on the same shapes, timed
as kvsift_cuda_bench times them per call (CUDA events around each call, L2 evicted by a read
before each). The statistic differs: this script reports the median of --reps single calls;
the benchmark, the median of 5 repetitions each averaging 100 calls. Run on the GPU machine
beside the benchmark:

    python3 cuda/torch_reference.py [--reps 50] [--json out.json]

- sparse decode attention: gather the kept K/V rows (torch.gather over the NHD cache seen as
  [B, H, ctx, D]) then F.scaled_dot_product_attention with GQA (bf16, Llama-3.1-8B layer:
  8 KV heads, 32 query heads, d = 128; context 32K; 2K and 10K kept; batch 1 and 64);
- segmented top-k: torch.topk over [segments, n] float32 keeping n / 10, and topk followed by a
  sort of the indices (kvsift's output is ascending indices).
"""
import argparse
import json

import torch
import torch.nn.functional as F


def timed(fn, reps, flush):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.sum()  # a read: evicts L2 leaving clean lines (as the benchmark's flush)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)  # microseconds
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="", help="attention or topk (default: both)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)  # 256 MiB, 5x L2
    rows = []
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    ctx, heads, q_heads, d = 32768, 8, 32, 128
    gen = torch.Generator(device=dev).manual_seed(5)
    for kept in (2048, 10240) if args.only != "topk" else ():
        for batch in (1, 64):
            k = torch.rand(batch, ctx, heads, d, device=dev, generator=gen).sub_(0.5).bfloat16()
            v = torch.rand(batch, ctx, heads, d, device=dev, generator=gen).sub_(0.5).bfloat16()
            q = torch.rand(batch, q_heads, d, device=dev, generator=gen).sub_(0.5).bfloat16()
            scores = torch.rand(batch, heads, ctx, device=dev, generator=gen)
            idx = scores.topk(kept, dim=-1).indices.sort(dim=-1).values  # random, ascending

            def step():
                gi = idx.unsqueeze(-1).expand(-1, -1, -1, d)
                kg = torch.gather(k.transpose(1, 2), 2, gi)
                vg = torch.gather(v.transpose(1, 2), 2, gi)
                return F.scaled_dot_product_attention(q.unsqueeze(2), kg, vg, enable_gqa=True)

            us = timed(step, args.reps, flush)
            nbytes = 2 * batch * heads * kept * d * 2
            rows.append({"name": f"torch_gather_sdpa/bf16/{ctx}/{kept}/{batch}", "us": us,
                         "GBps": nbytes / us / 1e3})
            print(f"{rows[-1]['name']:40s} {us:10.1f} us  {rows[-1]['GBps']:8.1f} GB/s")
            del k, v, q, scores, idx
            torch.cuda.empty_cache()

    for n, segments in ((4096, 256), (32768, 256), (131072, 32)) if args.only != "attention" else ():
        x = torch.rand(segments, n, device=dev, generator=gen)
        kk = n // 10
        us = timed(lambda: torch.topk(x, kk, dim=1), args.reps, flush)
        rows.append({"name": f"torch_topk/{n}/{segments}", "us": us})
        us2 = timed(lambda: torch.topk(x, kk, dim=1).indices.sort(dim=1), args.reps, flush)
        rows.append({"name": f"torch_topk_sorted_indices/{n}/{segments}", "us": us2})
        print(f"torch_topk/{n}/{segments}: {us:.1f} us; with the indices sorted {us2:.1f} us")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
