import csv, statistics, collections, sys
rows=[r for r in csv.DictReader(l for l in open(sys.argv[1] if len(sys.argv) > 1 else 'raw.csv') if not l.startswith('#'))]
d=collections.defaultdict(list); rr=collections.defaultdict(list)
for r in rows:
    k=(int(r['size_kib']),int(r['threads'])); d[k].append(float(r['MBps'])); rr[k].append(float(r['reads_per_s']))
    assert r['errs']=='0'
sizes=sorted({k[0] for k in d})
def lab(s): return f"{s} KiB" if s<1024 else f"{s//1024} MiB"
print("| Read size | MB/s @1 thr | MB/s @4 thr | MB/s @8 thr | reads/s @4 thr |")
print("|---|---:|---:|---:|---:|")
for s in sizes:
    print(f"| {lab(s)} | {statistics.median(d[s,1]):.0f} | {statistics.median(d[s,4]):.0f} | {statistics.median(d[s,8]):.0f} | {statistics.median(rr[s,4]):.0f} |")
peak=max(statistics.median(d[s,4]) for s in sizes)
ps=[s for s in sizes if statistics.median(d[s,4])==peak][0]
print(f"\nPeak MB/s at 4 threads (median): {peak:.0f} at {lab(ps)}")
for f in (0.8,0.9):
    s=next(s for s in sizes if statistics.median(d[s,4])>=f*peak)
    print(f"Smallest size reaching {int(f*100)}% of peak ({f*peak:.0f} MB/s) at 4 threads: {lab(s)}")
print("\nAll 3 runs (MB/s, rep0/rep1/rep2):")
print("| Read size | 1 thr | 4 thr | 8 thr |\n|---|---|---|---|")
for s in sizes:
    print(f"| {lab(s)} | " + " | ".join("/".join(f"{x:.0f}" for x in d[s,t]) for t in (1,4,8)) + " |")
