import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1])]
print("rows", len(rows))
seq=["read","decoded","parse_only","parsed","tok_start","rendered","encoded","hashed","rr","bound","routed","decided","posting","head","relay_first","w2","w3"]
def q(xs,p): xs=sorted(xs); return xs[min(len(xs)-1,int(p*len(xs)))]
prev="start"
for k in seq:
    d=[r[k]-(r[prev] if prev!="start" else 0) for r in rows if k in r and (prev=="start" or prev in r)]
    if d: print(f"{prev:>12} -> {k:<12} n={len(d):4d} mean {st.mean(d):7.3f} p50 {q(d,.5):7.3f} p90 {q(d,.9):7.3f}")
    if d: prev=k
tot=[r["w3"] for r in rows]; pre=[r["posting"] for r in rows if "posting" in r]
print("start->posting mean %.3f p50 %.3f p90 %.3f"%(st.mean(pre),q(pre,.5),q(pre,.9)))
cpu=[(r["cpu_posting"]-r["cpu0"])*1000 for r in rows if "cpu_posting" in r]
print("main-thread cpu start->posting (incl. others' interleaved) mean %.3f p50 %.3f"%(st.mean(cpu),q(cpu,.5)))
print("bytes w2 p50", q([r["b2"] for r in rows],.5), "w3", q([r["b3"] for r in rows],.5))
