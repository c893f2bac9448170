#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Markdown summary of a kvsift_bench JSON file (Google Benchmark --benchmark_out).

Usage: /usr/bin/python3 bench/summarize.py bench.json [--quiet quiet.json] > summary.md
  --quiet: bench.json is a loaded run (scripts/bench.sh --loaded); add a table of each decode row's
           step p99 against its step p50 in quiet.json (the loaded goal: p99 <= 3x the quiet p50),
           beside the host's own tail at that step length (BM_scheduler_reference)
Standard library only. Names follow BM_<family>/<component>/<model>/<dtype>/n<n>[/B<budget>]/r<r>.
"""

import json
import math
import re
import sys

TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
MEMORY_BOUND_SCORERS = {"key_norm", "page_minmax", "lag"}  # goal: >= 60% of the reference
DECODE_GOAL = 1.5  # a decode step within 1.5x of reading its resident KV once
ARITHMETIC_GOAL = 0.9  # or, where the arithmetic is the limit, 90% of exact arithmetic's rate
LOADED_GOAL = 3.0  # on a busy host, a decode step's p99 within 3x its quiet median
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


def within(r, bw=None):
    """A decode row meets the goal: within 1.5x of reading its resident KV once (bw: its
    bw_fraction, by default against the reference beside it), or, where the arithmetic is the
    limit, at >= 90% of the rate of the arithmetic the exact kernels use, a multiply and then an
    add (exact_fraction >= 0.9; a run from before that reference: fma_fraction)."""
    bw = r["bw"] if bw is None else bw
    x = (1.0 / bw) if bw else float("inf")
    return x <= DECODE_GOAL or (ARITHMETIC_REFERENCE_OK and arithmetic_fraction(r) >= ARITHMETIC_GOAL)


# Whether the run's arithmetic reference ran on the decode path's vector width (main() checks the
# lanes against kvsift_simd): a reference measured narrower than the kernels it is compared with
# (as one was, on the amx path before 2026-12-05) would let slow rows pass by arithmetic.
ARITHMETIC_REFERENCE_OK = True
PATH_LANES = {"amx": 16, "avx512": 16, "avx2": 8, "portable": 4}


def check_arithmetic_reference(ctx, rows):
    """Sets ARITHMETIC_REFERENCE_OK for a run (its context and rows, as load() returns them):
    whether BM_arithmetic_reference ran on its decode path's lanes. Returns (lanes, the path's
    lanes) on a mismatch, else None."""
    global ARITHMETIC_REFERENCE_OK
    simd = ctx.get("kvsift_simd")
    aref = [r for r in rows if r["name"].startswith("BM_arithmetic_reference")]
    lanes = int(aref[0]["raw"].get("lanes", 0)) if aref else 0
    ARITHMETIC_REFERENCE_OK = not aref or simd not in PATH_LANES or lanes == PATH_LANES[simd]
    return None if ARITHMETIC_REFERENCE_OK else (lanes, PATH_LANES[simd])


def arithmetic_fraction(r):
    raw = r["raw"]
    v = raw.get("exact_fraction", raw.get("fma_fraction"))
    return v or 0.0


def host_references(rows):
    """BM_scheduler_reference rows (fixed work in registers, timed step by step), shortest first."""
    refs = [r for r in rows if r["name"].startswith("BM_scheduler_reference/")]
    return sorted(refs, key=lambda r: r["raw"].get("step_nominal_ms", 0.0))


def host_table(rows, quiet_rows):
    """The host's own tail: each reference step's p99 against its quiet p50 (or its own p50)."""
    refs = host_references(rows)
    if not refs:
        return {}
    quiet = {r["name"]: r for r in host_references(quiet_rows or [])}
    # without a quiet pass of the references (e.g. --against a --quick run), each is against its
    # own p50 here, which a busy host inflates: then no ratio goes beside the decode rows
    base = "quiet p50" if quiet else "own p50"
    print("## The host's own tail (BM_scheduler_reference: fixed work in registers, no memory)")
    print()
    print(f"| step (nominal) | {base} | p50 | p99 | p99 / {base} | within 3x |")
    print("|---|---|---|---|---|---|")
    ratios = {}  # quiet p50 (ms) -> p99 / quiet p50
    for r in refs:
        raw = r["raw"]
        q = quiet.get(r["name"])
        qp50 = (q or r)["raw"].get("step_p50_ms")
        if not qp50:
            continue
        ratio = raw["step_p99_ms"] / qp50
        ratios[qp50] = ratio
        print(f"| {fmt_time(raw['step_nominal_ms'] / 1e3)} | {fmt_time(qp50 / 1e3)} | "
              f"{fmt_time(raw['step_p50_ms'] / 1e3)} | {fmt_time(raw['step_p99_ms'] / 1e3)} | "
              f"{ratio:.2f} | {'yes' if ratio <= LOADED_GOAL else 'no'} |")
    print()
    print(f"{sum(x <= LOADED_GOAL for x in ratios.values())} of {len(ratios)} reference steps within "
          f"3x of their {base}: where they are not, the host interrupts a step of that length for "
          "longer than twice the step whatever the step computes.")
    print()
    return ratios if quiet else {}


def nearest_host_ratio(host, p50):
    """The host reference's p99 / quiet p50 at the step length nearest `p50` (ms, by ratio)."""
    if not host or not p50:
        return None
    return host[min(host, key=lambda q: abs(math.log(q / p50)))]


def loaded_table(decode, quiet_rows, key, host):
    quiet = {key(r): r for r in quiet_rows if r.get("family") == "decode"}
    print("## Decode step on a busy host against the quiet run")
    print()
    print("| method | model | dtype | n | budget | requests | quiet p50 | loaded p50 | loaded p99 | "
          "p99 / quiet p50 | within 3x | host reference at this length |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in decode:
        q = quiet.get(key(r))
        p50, p99 = r["raw"].get("step_p50_ms"), r["raw"].get("step_p99_ms")
        qp50 = q["raw"].get("step_p50_ms") if q else None
        if p50 is None or p99 is None or not qp50:
            continue
        ratio = p99 / qp50
        ratios.append(ratio)
        h = nearest_host_ratio(host, qp50)
        print(f"| {r['component']} | {r['model']} | {r['dtype']} | {fmt_n(r['n'])} | "
              f"{budget_cell(r)} | {r['r']} | {fmt_time(qp50 / 1e3)} | {fmt_time(p50 / 1e3)} | "
              f"{fmt_time(p99 / 1e3)} | {ratio:.2f} | {'yes' if ratio <= LOADED_GOAL else 'no'} | "
              f"{f'{h:.2f}' if h is not None else '-'} |")
    print()
    if ratios:
        print(f"{len(ratios)} rows; {sum(x <= LOADED_GOAL for x in ratios)} within 3x; worst "
              f"p99 / quiet p50 = {max(ratios):.2f}.")
        print()


def main(argv):
    quiet_path = None
    if len(argv) == 4 and argv[2] == "--quiet":
        quiet_path = argv[3]
        argv = argv[:2]
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    ctx, rows = load(argv[1])
    quiet_rows = load(quiet_path)[1] if quiet_path else None
    print("# kvsift CPU benchmarks")
    print()
    threading = ctx.get("kvsift_threading")
    if threading:
        print(f"- kvsift threading: {threading}")
    simd = ctx.get("kvsift_simd")
    if simd:
        print(f"- decode attention path: {simd} (KVSIFT_SIMD pins a lower one)")
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
    aref = [r for r in rows if r["name"].startswith("BM_arithmetic_reference")]
    if aref:
        raw = aref[0]["raw"]
        print(f"- arithmetic reference (BM_arithmetic_reference: independent f32 multiply-adds, "
              f"{int(raw.get('lanes', 0))} lanes, {int(raw.get('threads', 0))} OpenMP threads, "
              f"best pass): **{raw.get('best_fma_per_second', 0) / 1e9:.1f} G multiply-adds/s** "
              f"(all threads {raw.get('all_threads_fma_per_second', 0) / 1e9:.1f}, one thread "
              f"{raw.get('one_thread_fma_per_second', 0) / 1e9:.1f})")
        mismatch = check_arithmetic_reference(ctx, rows)
        if mismatch:
            print(f"- **the arithmetic reference ran on {mismatch[0]} lanes, the {simd} path computes on "
                  f"{mismatch[1]}**: fma_fraction and exact_fraction are not comparable, and no "
                  f"row counts as within the goal by arithmetic")
        if raw.get("best_exact_madd_per_second"):
            print(f"- exact arithmetic reference (the same chains as a multiply and then an add, each "
                  f"rounded on its own, as the exact kernels compute; best of all threads and one): "
                  f"**{raw['best_exact_madd_per_second'] / 1e9:.1f} G multiply-adds/s**")
    beside_run = ctx.get("kvsift_reference", "beside") == "beside"
    decode_ref = ("the reference beside the row: the same read, one pass before its steps and one "
                  "after every ~20 ms of them, each stretch against the better pass either side; "
                  "\"x run ref\" divides by the run's reference above instead" if beside_run else
                  "the run's reference above (--kvsift_reference=run)")
    print(f"- bw_fraction = bytes/s of the benchmark / the reference (decode rows: {decode_ref}); "
          "bytes = the minimal traffic "
          "(decode: the layer's resident KV read once); fma_fraction = the decode step's attention "
          "multiply-adds (2 x G x d per token and KV head it reads) per second / the arithmetic "
          "reference; exact_fraction = the same / the exact arithmetic reference")
    print()

    key = lambda r: (r["model"], r["component"], r["dtype"], r["n"], r["budget"] or 0, r["r"])
    parsed = [r for r in rows if "family" in r]

    decode = sorted((r for r in parsed if r["family"] == "decode"), key=key)
    if decode:
        print("## Decode step (one layer: decode + attend + after_attention)")
        print()
        print("| method | model | dtype | n | budget | requests | time per decode step | "
              "step p50 | step p99 | resident KV | reference beside | bw_fraction | x read-once | "
              "x run ref | fma_fraction | exact_fraction | within goal |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in decode:
            x = (1.0 / r["bw"]) if r["bw"] else float("inf")
            run = r["raw"].get("bw_fraction_run")
            beside = r["raw"].get("bw_reference_beside")
            p50, p99 = r["raw"].get("step_p50_ms"), r["raw"].get("step_p99_ms")
            print(f"| {r['component']} | {r['model']} | {r['dtype']} | {fmt_n(r['n'])} | "
                  f"{budget_cell(r)} | {r['r']} | {fmt_time(r['seconds'])} | "
                  f"{fmt_time(p50 / 1e3) if p50 is not None else '-'} | "
                  f"{fmt_time(p99 / 1e3) if p99 is not None else '-'} | "
                  f"{fmt_bytes(r['resident'] or 0)} | "
                  f"{f'{beside / 1e9:.1f} GB/s' if beside else '-'} | {bw_cell(r['bw'])} | {x:.1f} | "
                  f"{f'{1.0 / run:.1f}' if run else '-'} | "
                  f"{bw_cell(r['raw'].get('fma_fraction'))} | "
                  f"{bw_cell(r['raw'].get('exact_fraction'))} | "
                  f"{'yes' if within(r) else 'no'} |")
        print()
        inside = sum(1 for r in decode if within(r))
        strict = sum(1 for r in decode if within(r, r["raw"].get("bw_fraction_run", r["bw"])))
        against = (f", against the reference beside each row; {strict} of {len(decode)} against "
                   f"the run's reference" if beside_run else ", against the run's reference")
        print(f"{inside} of {len(decode)} decode rows within {DECODE_GOAL}x of reading their "
              f"resident KV once (or at >= {ARITHMETIC_GOAL} of the exact arithmetic reference)"
              f"{against}.")
        print()
        if quiet_path:
            loaded_table(decode, quiet_rows, key, host_table(rows, quiet_rows))
    if host_references(rows) and not (decode and quiet_path):
        host_table(rows, quiet_rows)

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
    other = [r for r in rows if "family" not in r
             and not r["name"].startswith(("BM_bandwidth", "BM_arithmetic", "BM_scheduler"))]
    for r in other:
        print(f"- {r['name']}: {fmt_time(r['seconds'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
