#!/usr/bin/python3
"""The quick suite's decode rows over several runs, one line per row (docs/performance.md,
"Current tables"). Usage: tables.py RUN1/bench.json RUN2/bench.json ... [--loaded L/bench.json
--quiet Q/bench.json]. Rows are read with bench/summarize.py's parser; "within" counts the runs
where the row is within 1.5x of reading its resident KV once (or at >= 0.9 of the exact
arithmetic reference, when that reference ran on the decode path's lanes)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import summarize  # noqa: E402


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def main(argv):
    loaded = quiet = None
    if "--loaded" in argv:
        i = argv.index("--loaded")
        loaded, quiet = argv[i + 1], argv[argv.index("--quiet") + 1]
        argv = argv[:i]
    runs = []
    for path in argv[1:]:
        ctx, rows = summarize.load(path)
        summarize.check_arithmetic_reference(ctx, rows)
        runs.append({r["name"]: (r, summarize.within(r)) for r in rows if r.get("family") == "decode"})
    ratio = {}
    if loaded:
        q = {r["name"]: r for r in summarize.load(quiet)[1] if r.get("family") == "decode"}
        for r in summarize.load(loaded)[1]:
            if r.get("family") == "decode" and r["name"] in q:
                ratio[r["name"]] = r["raw"]["step_p99_ms"] / q[r["name"]]["raw"]["step_p50_ms"]
    print("| row | resident KV | reference beside (GB/s) | step p50 | x read-once, each run | within |"
          + (" loaded p99 / quiet p50 |" if loaded else ""))
    print("|---|---|---|---|---|---|" + ("---|" if loaded else ""))
    total = [0] * len(runs)
    for name in runs[0]:
        cells = [run[name] for run in runs if name in run]
        rs = [c[0] for c in cells]
        label = name.replace("BM_decode/", "").replace("/real_time", "").replace("llama31_8b/", "")
        ref = [r["raw"].get("bw_reference_beside", 0) / 1e9 for r in rs]
        p50 = [r["raw"]["step_p50_ms"] / 1e3 for r in rs]
        x = ", ".join(f"{1 / r['bw']:.2f}" for r in rs)
        inside = sum(1 for c in cells if c[1])
        for k, run in enumerate(runs):
            total[k] += 1 if name in run and run[name][1] else 0
        line = (f"| {label} | {rs[0]['raw']['resident_bytes'] / 1e6:.1f} MB | {min(ref):.0f}-{max(ref):.0f} | "
                f"{fmt_time(min(p50))}-{fmt_time(max(p50))} | {x} | {inside} of {len(cells)} |")
        if loaded:
            line += f" {ratio[name]:.2f} |" if name in ratio else " - |"
        print(line)
    print()
    print("Rows within, per run: " + ", ".join(f"{t} of {len(runs[0])}" for t in total) + ".")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
