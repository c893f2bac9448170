#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Markdown summary of a kvsift_bench JSON file (Google Benchmark --benchmark_out).

Usage: /usr/bin/python3 bench/summarize.py bench.json > summary.md
Standard library only. Names follow BM_<family>/<component>/<model>/<dtype>/n<n>[/B<budget>]/r<r>.
"""

import json
import re
import sys

TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
MEMORY_BOUND_SCORERS = {"key_norm", "page_minmax", "lag"}  # goal: >= 60% of the reference
DECODE_GOAL = 1.5  # a decode step within 1.5x of reading its resident KV once
NAME = re.compile(
    r"^BM_(?P<family>[a-z_]+)/(?P<component>[a-z0-9_]+)/(?P<model>[a-z0-9_]+)/(?P<dtype>[a-z0-9]+)"
    r"/n(?P<n>\d+)(?:/B(?P<budget>\d+))?/r(?P<r>\d+)")


def fmt_time(seconds):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_n(n):
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def fmt_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = []
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        name = b["name"].replace("/real_time", "")
        seconds = b["real_time"] * TO_SECONDS[b.get("time_unit", "ns")]
        m = NAME.match(name)
        row = {"name": name, "seconds": seconds, "bw": b.get("bw_fraction"),
               "bps": b.get("bytes_per_second"), "tps": b.get("tokens_per_second"),
               "resident": b.get("resident_bytes"), "raw": b}
        if m:
            row.update(family=m["family"], component=m["component"], model=m["model"],
                       dtype=m["dtype"], n=int(m["n"]),
                       budget=int(m["budget"]) if m["budget"] else None, r=int(m["r"]))
        rows.append(row)
    return data.get("context", {}), rows


def budget_cell(row):
    if row["budget"] is None:
        return "all" if row["component"] == "full_kv" else "-"
    return fmt_n(row["budget"])


def bw_cell(v):
    return "-" if v is None else f"{v:.3f}"


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    ctx, rows = load(argv[1])
    print("# kvsift CPU benchmarks")
    print()
    print(f"- host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs @ "
          f"{ctx.get('mhz_per_cpu', '?')} MHz, load average "
          f"{', '.join(f'{x:.1f}' for x in ctx.get('load_avg', [])) or '?'}; run {ctx.get('date', '?')}")
    ref = [r for r in rows if r["name"].startswith("BM_bandwidth_reference")]
    if ref:
        raw = ref[0]["raw"]
        print(f"- bandwidth reference (BM_bandwidth_reference: sum over a 256 MB float array, "
              f"{int(raw.get('threads', 0))} OpenMP threads, best pass): "
              f"**{raw.get('best_bytes_per_second', 0) / 1e9:.2f} GB/s** (all threads "
              f"{raw.get('all_threads_bytes_per_second', 0) / 1e9:.2f}, one thread "
              f"{raw.get('one_thread_bytes_per_second', 0) / 1e9:.2f}; the best of the two)")
    else:
        print("- bandwidth reference: measured lazily (BM_bandwidth_reference filtered out)")
    print("- bw_fraction = bytes/s of the benchmark / the reference; bytes = the minimal traffic "
          "(decode: the layer's resident KV read once)")
    print()

    key = lambda r: (r["model"], r["component"], r["dtype"], r["n"], r["budget"] or 0, r["r"])
    parsed = [r for r in rows if "family" in r]

    decode = sorted((r for r in parsed if r["family"] == "decode"), key=key)
    if decode:
        print("## Decode step (one layer: decode + attend + after_attention)")
        print()
        print("| method | model | dtype | n | budget | requests | time per decode step | "
              "step p50 | step p99 | resident KV | bw_fraction | x read-once | within 1.5x |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in decode:
            x = (1.0 / r["bw"]) if r["bw"] else float("inf")
            p50, p99 = r["raw"].get("step_p50_ms"), r["raw"].get("step_p99_ms")
            print(f"| {r['component']} | {r['model']} | {r['dtype']} | {fmt_n(r['n'])} | "
                  f"{budget_cell(r)} | {r['r']} | {fmt_time(r['seconds'])} | "
                  f"{fmt_time(p50 / 1e3) if p50 is not None else '-'} | "
                  f"{fmt_time(p99 / 1e3) if p99 is not None else '-'} | "
                  f"{fmt_bytes(r['resident'] or 0)} | {bw_cell(r['bw'])} | {x:.1f} | "
                  f"{'yes' if x <= DECODE_GOAL else 'no'} |")
        print()

    prefill = sorted((r for r in parsed if r["family"] == "prefill"), key=key)
    if prefill:
        print("## Prefill compression of one layer (chunks of 4096 tokens)")
        print()
        print("| method | model | dtype | n | budget | requests | time | tokens/s | bw_fraction |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in prefill:
            print(f"| {r['component']} | {r['model']} | {r['dtype']} | {fmt_n(r['n'])} | "
                  f"{budget_cell(r)} | {r['r']} | {fmt_time(r['seconds'])} | "
                  f"{(r['tps'] or 0) / 1e3:.1f}k | {bw_cell(r['bw'])} |")
        print()

    order = ["score", "select", "budget", "store", "transfer", "attention", "probe"]
    comps = sorted((r for r in parsed if r["family"] in order),
                   key=lambda r: (order.index(r["family"]),) + key(r))
    if comps:
        print("## Components")
        print()
        print("| family | component | model | dtype | n | budget | requests | time | GB/s | "
              "bw_fraction | goal |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in comps:
            goal = ""
            if r["family"] == "score" and r["component"] in MEMORY_BOUND_SCORERS:
                goal = ">= 0.6: " + ("yes" if (r["bw"] or 0) >= 0.6 else "no")
            print(f"| {r['family']} | {r['component']} | {r['model']} | {r['dtype']} | "
                  f"{fmt_n(r['n'])} | {budget_cell(r)} | {r['r']} | {fmt_time(r['seconds'])} | "
                  f"{(r['bps'] or 0) / 1e9:.2f} | {bw_cell(r['bw'])} | {goal} |")
        print()
    other = [r for r in rows if "family" not in r and not r["name"].startswith("BM_bandwidth")]
    for r in other:
        print(f"- {r['name']}: {fmt_time(r['seconds'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
