import json, sys, statistics, glob
def load(f):
    d = json.load(open(f)); out = {}
    for b in d['benchmarks']:
        if b['name'].startswith('BM_decode/'):
            n = b['name'].replace('BM_decode/','').replace('/real_time','')
            out[n] = (b['step_p50_ms'], 1/b['bw_fraction'])
    return out
old = [load(f) for f in sorted(glob.glob(sys.argv[1]))]
new = [load(f) for f in sorted(glob.glob(sys.argv[2]))]
ratios = []
print(f"{'row':58s} {'old p50 ms':>18s} {'new p50 ms':>18s} {'new/old':>7s}  x-read old | new")
for n in old[0]:
    o = [r[n][0] for r in old]; w = [r[n][0] for r in new]
    ratio = statistics.mean(w) / statistics.mean(o); ratios.append(ratio)
    print(f"{n:58s} {' '.join(f'{x:.3f}' for x in o):>18s} {' '.join(f'{x:.3f}' for x in w):>18s} {ratio:7.3f}  {' '.join(f'{r[n][1]:.2f}' for r in old)} | {' '.join(f'{r[n][1]:.2f}' for r in new)}")
print('geomean new/old', statistics.geometric_mean(ratios), 'median', statistics.median(ratios))
