# The "Current tables" of docs/performance.md from this directory's runs' bench.json files:
# python3 table.py 'q*/bench.json' l1/bench.json l1/quiet.json l2/bench.json l2/quiet.json
import glob, json, sys
def rows(f):
    out = {}
    for b in json.load(open(f))['benchmarks']:
        if b['name'].startswith('BM_decode/'):
            out[b['name'][len('BM_decode/'):].replace('/real_time', '')] = b
    return out
quick = [rows(f) for f in sorted(glob.glob(sys.argv[1]))]
loaded = [(rows(sys.argv[i]), rows(sys.argv[i + 1])) for i in range(2, len(sys.argv), 2)]
def span(v, fmt): return f"{fmt(min(v))}-{fmt(max(v))}"
us = lambda ms: f"{ms * 1e3:.0f} us" if ms < 1 else f"{ms:.2f} ms"
print("| row | resident KV | reference beside (GB/s) | step p50 | x read-once, each run | within 1.5x | loaded p99 / quiet p50 (nice 19, each run) |")
print("|---|---|---|---|---|---|---|")
for n in quick[0]:
    q = [r[n] for r in quick]
    x = [1 / b['bw_fraction'] for b in q]
    ref = [b['bw_reference_beside'] / 1e9 for b in q]
    lr = [f"{l[n]['step_p99_ms'] / qu[n]['step_p50_ms']:.2f}" for l, qu in loaded]
    print(f"| {n.replace('llama31_8b/', '')} | {q[0]['resident_bytes'] / 1e6:.1f} MB | {span(ref, lambda v: f'{v:.0f}')} | "
          f"{span([b['step_p50_ms'] for b in q], us)} | {', '.join(f'{v:.2f}' for v in x)} | "
          f"{sum(v <= 1.5 for v in x)} of {len(x)} | {', '.join(lr)} |")
