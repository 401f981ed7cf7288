#!/usr/bin/env python3
"""File-level import cycles inside one crate: `python3 tools/import_cycles.py crates/strata-model/src`.
Counts `crate::`/`super::` paths outside a trailing `#[cfg(test)] mod tests`; a child naming its
parent is not counted. Prints each cycle (strongly connected set of files)."""
import os,re,sys,collections
root=sys.argv[1] if len(sys.argv)>1 else 'src'
# map module path -> file
files={}
for d,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p=os.path.join(d,f); rel=os.path.relpath(p,root)[:-3].split('/')
            if rel[-1]=='mod': rel=rel[:-1]
            if rel in (['lib'],['main']): rel=[]
            files[tuple(rel)]=p
def resolve(parts):
    # longest prefix that is a file
    for i in range(len(parts),-1,-1):
        if tuple(parts[:i]) in files: return tuple(parts[:i])
    return None
edges=collections.defaultdict(set)
for mod,p in files.items():
    txt=open(p).read()
    # drop cfg(test) modules at end (rough: cut at '#[cfg(test)]\nmod tests')
    i=txt.find('#[cfg(test)]\nmod tests')
    if i>=0: txt=txt[:i]
    txt=re.sub(r'//[^\n]*','',txt)
    for m in re.finditer(r'\b(crate|super(?:::super)*)((?:::\w+)+)',txt):
        head,rest=m.group(1),m.group(2).split('::')[1:]
        if head=='crate': base=[]
        else:
            n=head.count('super')
            # module of this file: for mod.rs files, mod is dir
            base=list(mod)[:-n] if not p.endswith('mod.rs') or True else list(mod)[:-n]
            if p.endswith('mod.rs') or p.endswith('lib.rs'): base=list(mod)[:len(mod)-n]
            else: base=list(mod)[:len(mod)-n]
        t=resolve(base+rest)
        if t is not None and t!=mod and not (len(t)<len(mod) and t==mod[:len(t)]):
            edges[mod].add(t)
# strongly connected components (tarjan)
idx={};low={};st=[];on=set();sccs=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: sccs.append(comp)
for v in list(files):
    if v not in idx: sc(v)
for comp in sccs:
    print(len(comp), sorted('::'.join(x) for x in comp))
