import json, sys, statistics as st
def load(p):
    d = json.load(open(p))
    return {b['name'].replace('/real_time',''): b for b in d['benchmarks'] if b['name'].startswith('BM_decode/') and b.get('run_type','iteration')=='iteration'}
old=[load(f'{sys.argv[1]}-{i}/bench.json') for i in (1,2)]
new=[load(f'{sys.argv[2]}-{i}/bench.json') for i in (1,2)]
ratios=[]
print(f"{'row':60s} {'old p50 (ms)':>16s} {'new p50 (ms)':>16s} ratio")
for k in old[0]:
    o=[r[k]['step_p50_ms'] for r in old]; n=[r[k]['step_p50_ms'] for r in new]
    ratio=st.mean(n)/st.mean(o); ratios.append(ratio)
    print(f"{k.replace('BM_decode/',''):60s} {o[0]:7.3f} {o[1]:7.3f}  {n[0]:7.3f} {n[1]:7.3f}  {ratio:.2f}")
print(f"median new/old {st.median(ratios):.3f}; rows faster by >5%: {sum(r<0.95 for r in ratios)}, slower by >5%: {sum(r>1.05 for r in ratios)}, of {len(ratios)}")
