#!/usr/bin/env python3
"""A 10 MB chat prompt against `strata serve`: how long its refusal takes, whether another
model's short chat waits for it, and what it costs the server's memory.

    python3 tools/bench_huge_prompt.py BIN [SmolLM2-135M-Instruct.Q4_1.gguf]

Serves the GGUF as `smol` (context 8192) and tests/fixtures/hf/llama3 as `llama3`, then:
a 10 MB /v1/chat/completions to `smol` (refused: context_length_exceeded) with a 2-token
/api/chat to `llama3` 0.3 s after it; the same prompt on /api/chat with num_ctx 512 (cut
Ollama's way and answered); peak RSS (VmHWM) before and after. Standard library only.
"""
import json, sys, threading, time, subprocess, os, tempfile, urllib.request, urllib.error, socket
BIN=sys.argv[1]
def post(url, body):
    req=urllib.request.Request(url, json.dumps(body).encode(), {"content-type":"application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r: return r.status, r.read()
    except urllib.error.HTTPError as e: return e.code, e.read()
def hwm(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM"): return int(l.split()[1])//1024
s=socket.socket(); s.bind(("127.0.0.1",0)); port=s.getsockname()[1]; s.close()
home=tempfile.mkdtemp()
p=subprocess.Popen([BIN,"serve","--model","smol="+(sys.argv[2] if len(sys.argv) > 2 else "SmolLM2-135M-Instruct.Q4_1.gguf"),"--model","llama3=tests/fixtures/hf/llama3","--port",str(port)],env=dict(os.environ,STRATA_HOME=home),stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
u=f"http://127.0.0.1:{port}"
for _ in range(300):
    try:
        if urllib.request.urlopen(u+"/health").status==200: break
    except Exception: time.sleep(0.1)
ask={"model":"llama3","messages":[{"role":"user","content":"hi"}],"stream":False,"options":{"num_predict":2}}
post(u+"/api/chat",ask); post(u+"/api/chat",{**ask,"model":"smol"})
h0=hwm(p.pid); r0=[l for l in open(f'/proc/{p.pid}/status') if l.startswith('VmRSS')][0].split()[1]; print('RSS before', int(r0)//1024)
huge="All work and no play makes Jack a dull boy. "*230_000
big={}
t0=time.time()
def b():
    big["r"]=post(u+"/v1/chat/completions",{"model":"smol","messages":[{"role":"user","content":huge}],"max_tokens":1}); big["t"]=time.time()-t0
th=threading.Thread(target=b); th.start(); time.sleep(0.3)
t1=time.time(); st,_=post(u+"/api/chat",ask); small=time.time()-t1
th.join(); h1=hwm(p.pid)
t2=time.time(); st2,raw=post(u+"/api/chat",{**ask,"model":"smol","messages":[{"role":"user","content":huge}],"options":{"num_predict":2,"num_ctx":512}}); ol=time.time()-t2
rss=[l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]; print(f"RSS now {int(rss)//1024} MiB"); print(f"{BIN}: /v1 10MB refusal {big['t']:.2f}s status {big['r'][0]}; other model's 2-token chat meanwhile {small:.2f}s; /api/chat 10MB cut+answer {ol:.2f}s status {st2}; peak RSS {h0} -> {h1} MiB after the refusal, {hwm(p.pid)} MiB after the cut")
p.terminate(); p.wait()
