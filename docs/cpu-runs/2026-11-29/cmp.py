# Quick-suite decode rows of two trees, row by row: cmp.py OLDPREFIX NEWPREFIX (directories
# OLDPREFIX-1, OLDPREFIX-2, ... each holding a bench.json); the median step p50 of each tree's runs.
import glob, json, sys, statistics as st

def load(p):
    d = json.load(open(p))
    return {b['name'].replace('/real_time', ''): b for b in d['benchmarks']
            if b['name'].startswith('BM_decode/') and b.get('run_type', 'iteration') == 'iteration'}

def runs(prefix):
    return [load(p) for p in sorted(glob.glob(f'{prefix}-*/bench.json'))]

old, new = runs(sys.argv[1]), runs(sys.argv[2])
print(f'{len(old)} old runs, {len(new)} new runs; per row the median of the runs\' step p50 (ms)')
print(f"{'row':56s} {'old':>8s} {'new':>8s} ratio")
ratios = []
for k in old[0]:
    o = st.median(r[k]['step_p50_ms'] for r in old)
    n = st.median(r[k]['step_p50_ms'] for r in new)
    ratios.append(n / o)
    print(f"{k.replace('BM_decode/', ''):56s} {o:8.3f} {n:8.3f} {n / o:.2f}")
print(f'median new/old {st.median(ratios):.3f}; rows faster by >5%: {sum(r < 0.95 for r in ratios)}, '
      f'slower by >5%: {sum(r > 1.05 for r in ratios)}, of {len(ratios)}')
