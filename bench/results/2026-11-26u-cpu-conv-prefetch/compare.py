import json,sys
def load(f):
    d=json.load(open(f)); rows=d['results'] if 'results' in d else d
    return {r['name']:r['value'] for r in rows}
tf=sys.argv[1]; files=sys.argv[2:]
ts=[load(f) for f in tf.split(',')]
runs={f.split('/')[-1][:-5]:load(f) for f in files}
for name in sorted(runs[list(runs)[0]]):
    if name not in ts[0]: continue
    print(f"{name:34}", ' '.join(f"{k}={v[name]:.3f}" for k,v in runs.items()), 'torch='+'/'.join(f"{t[name]:.3f}" for t in ts))
