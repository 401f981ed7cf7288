#!/usr/bin/env python3
"""Open WebUI in headless Chromium against `strata serve`, on both of its connections.

A manual end-to-end check, never run in CI (Open WebUI is far too large for it). It:

1. starts `strata serve --model GGUF` on a free port, STRATA_HOME in a temp dir, Strata's
   defaults otherwise (extra flags with --strata-arg; its request log at debug level);
2. puts a small recording proxy in front of it (stdlib + aiohttp from Open WebUI's venv)
   that logs every request Open WebUI sends: path, status, seconds, and what kind of
   request it is (the chat itself, or the title / tags / follow-ups side requests);
3. starts Open WebUI offline (OFFLINE_MODE, HF_HUB_OFFLINE, WEBUI_AUTH=False, DATA_DIR in
   a temp dir) with its Ollama connection and its OpenAI connection (model ids prefixed
   `oai.`) both pointed at Strata, through the proxy;
4. drives headless Chromium with selenium: for each connection a new chat, the model
   picked in the model selector, "What is the capital of France?", then "And of Italy?",
   each turn waited for until generation has finished; screenshots, the visible reply
   texts and any error box Open WebUI shows (the grey box under the model's name);
5. prints a JSON summary and exits 1 if any turn failed (an error box, no reply text or
   a timeout), 2 if the setup failed.

Needs (not in CI): Debian's `chromium` and `chromium-driver` (/usr/bin/chromium,
/usr/bin/chromedriver), and a virtual environment with Open WebUI and selenium:

    apt-get install -y chromium chromium-driver
    python3.11 -m venv /work/owui/venv
    /work/owui/venv/bin/pip install 'open-webui==0.12.4' selenium

Run it with that venv's python (it imports selenium and aiohttp):

    /work/owui/venv/bin/python tools/open_webui_e2e.py \\
        --strata target/release/strata \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --open-webui /work/owui/venv/bin/open-webui \\
        --out /tmp/owui-run [--strata-arg=--ctx-size --strata-arg=8192]

--out receives the screenshots (`<connection>-turn<N>.png`, `<connection>-final.png`),
the page HTML at the end of each chat, strata.log, open-webui.log, requests.jsonl (the
proxy's record) and summary.json (what is printed).
"""

import argparse
import asyncio
import collections
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

QUESTIONS = ["What is the capital of France?", "And of Italy?"]
OPENAI_PREFIX = "oai"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, proc, timeout, what):
    """Waits for `url` to answer 200; fails early if `proc` exits."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(1)
    raise RuntimeError(f"{what} not healthy at {url} after {timeout} s ({last})")


def stop(proc, name, grace=15):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        print(f"{name} did not stop in {grace} s: killing it", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- The recording proxy -------------------------------------------------------------

def classify(body):
    """What an Open WebUI request to a model is: its chat, or one of its side tasks."""
    if not isinstance(body, dict):
        return None
    msgs = body.get("messages") or []
    text = " ".join(m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                    for m in msgs if isinstance(m, dict))
    text += body.get("prompt") or ""
    m = re.search(r"### Task:\s*(.*)", text)
    if m:  # Open WebUI's task prompts start with "### Task:" and a line saying which
        line = m.group(1).lower()
        for kind, words in (("title", ("title",)), ("tags", ("tags",)), ("follow_ups", ("follow-up", "might naturally send next", "predict")),
                            ("queries", ("quer",)), ("autocomplete", ("autocomplete", "continue"))):
            if any(w in line for w in words):
                return kind
        return "task"
    return "chat"


def usage_of(tail):
    """Token counts and the finish reason from a response's last bytes (Ollama or OpenAI)."""
    u = {}
    for k in ("prompt_eval_count", "eval_count", "prompt_tokens", "completion_tokens", "cached_tokens"):
        m = re.findall(r'"%s":(\d+)' % k, tail)
        if m:
            u[k] = int(m[-1])
    m = re.findall(r'"(?:done_reason|finish_reason)":"(\w+)"', tail)
    if m:
        u["finish"] = m[-1]
    return u or None


class Proxy:
    """An HTTP proxy on a free port to `upstream` that streams bodies through and writes
    one JSON line per request to `record` (path, status, seconds, kind, sizes)."""

    def __init__(self, upstream, record):
        self.upstream = upstream
        self.record = record
        self.port = free_port()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.entries = []
        self.loop = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the recording proxy did not start")

    def _run(self):
        from aiohttp import ClientSession, ClientTimeout, web

        hop = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "host", "content-length",
               "accept-encoding", "content-encoding"}

        async def handle(req):
            raw = await req.read()
            t0 = time.time()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            entry = {"t": round(t0, 3), "method": req.method, "path": req.path_qs}
            if isinstance(body, dict):
                entry.update(model=body.get("model"), stream=body.get("stream"), kind=classify(body),
                             messages=len(body.get("messages") or []), tools=len(body.get("tools") or []),
                             request_bytes=len(raw))
                if body.get("options"):
                    entry["options"] = body.get("options")
                if body.get("max_tokens") is not None:
                    entry["max_tokens"] = body.get("max_tokens")
            with self.lock:
                self.in_flight += 1
            head, tail, n = b"", b"", 0
            try:
                headers = {k: v for k, v in req.headers.items() if k.lower() not in hop}
                async with self.session.request(req.method, self.upstream + req.path_qs, data=raw or None,
                                                headers=headers, allow_redirects=False) as up:
                    entry["status"] = up.status
                    resp = web.StreamResponse(status=up.status, headers={
                        k: v for k, v in up.headers.items() if k.lower() not in hop})
                    await resp.prepare(req)
                    async for chunk in up.content.iter_any():
                        if "first_byte_seconds" not in entry:
                            entry["first_byte_seconds"] = round(time.time() - t0, 3)
                        if len(head) < 600:
                            head += chunk[:600 - len(head)]
                        tail = (tail + chunk)[-1500:]
                        n += len(chunk)
                        await resp.write(chunk)
                    await resp.write_eof()
                    return resp
            except Exception as e:  # the upstream went away, or the client did
                entry["proxy_error"] = f"{type(e).__name__}: {e}"
                raise
            finally:
                entry["seconds"] = round(time.time() - t0, 3)
                entry["response_bytes"] = n
                if entry.get("status", 0) >= 400:
                    entry["error_body"] = head.decode("utf-8", "replace")
                elif body is not None and req.path.rstrip("/") not in ("/api/tags", "/api/ps", "/v1/models"):
                    entry["response_head"] = head.decode("utf-8", "replace")[:300]
                    entry["response_tail"] = tail.decode("utf-8", "replace")[-700:]
                    entry["usage"] = usage_of(entry["response_tail"])
                with self.lock:
                    self.in_flight -= 1
                    self.entries.append(entry)
                    with open(self.record, "a") as f:
                        f.write(json.dumps(entry) + "\n")

        async def main():
            self.session = ClientSession(timeout=ClientTimeout(total=None, sock_read=None), auto_decompress=False)
            app = web.Application(client_max_size=256 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self.ready.set()
            while True:
                await asyncio.sleep(3600)

        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(main())

    def busy(self, kinds=None):
        with self.lock:
            return self.in_flight

    def summary(self):
        with self.lock:
            entries = list(self.entries)
        counts = collections.Counter()
        for e in entries:
            key = f'{e["method"]} {e["path"].split("?")[0]}'
            if e.get("kind"):
                key += f' [{e["kind"]}]'
            key += f' -> {e.get("status", e.get("proxy_error", "?"))}'
            counts[key] += 1
        return dict(sorted(counts.items()))


# --- The browser ----------------------------------------------------------------------

# The chat as the page shows it: every message (role, text, the error box's text) and
# whether a generation is running (the Stop button in the input bar).
SNAPSHOT_JS = r"""
const out = {stop: false, messages: [], toasts: []};
for (const b of document.querySelectorAll('button')) {
  const l = (b.getAttribute('aria-label') || '');
  if (l === 'Stop' || l === 'Stop generating' || b.id === 'stop-response-button') out.stop = true;
}
for (const t of document.querySelectorAll('[data-sonner-toast]')) out.toasts.push(t.innerText.trim());
for (const el of document.querySelectorAll('[id^="message-"]')) {
  if (!/^message-[0-9a-f-]{36}$/.test(el.id)) continue;
  const user = el.querySelector('.chat-user');
  const asst = el.querySelector('.chat-assistant');
  if (!user && !asst) continue;
  const m = {id: el.id.slice(8), role: user ? 'user' : 'assistant'};
  if (user) { m.text = user.innerText.trim(); out.messages.push(m); continue; }
  const c = asst.querySelector('#response-content-container') || asst;
  const prose = c.querySelectorAll('.markdown-prose, [class*="markdown"]');
  // The error box: a rounded grey (or red) panel with an info icon and the message.
  let err = null;
  for (const d of c.querySelectorAll('div')) {
    const cls = d.className && d.className.baseVal === undefined ? d.className : '';
    if (/rounded/.test(cls) && /(bg-black\/\[0\.03\]|bg-red-|text-red-)/.test(cls) && d.querySelector(':scope > svg')
        && !d.closest('.markdown-prose')) { err = d.innerText.trim(); break; }
  }
  m.error = err;
  let text = c.innerText.trim();
  if (err && text.startsWith(err)) text = text.slice(err.length).trim();
  m.text = err && text === err ? '' : text;
  m.model = (el.querySelector('#response-message-model-name') || {}).innerText || null;
  const bar = el.querySelector('.buttons');
  m.buttons = bar ? Array.from(bar.querySelectorAll('button')).map(b => b.getAttribute('aria-label')).filter(x => x) : [];
  m.streaming = !!c.querySelector('.animate-cursor-pulse');
  out.messages.push(m);
}
return out;
"""


def make_driver(args, profile):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    o = webdriver.ChromeOptions()
    o.binary_location = args.chromium
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        o.add_argument(a)
    d = webdriver.Chrome(service=Service(args.chromedriver), options=o)
    d.set_window_size(1400, 1000)
    d.set_script_timeout(60)
    return d


def dismiss_dialogs(d):
    from selenium.webdriver.common.by import By

    for b in d.find_elements(By.XPATH, "//button[contains(., \"Okay, Let's Go!\")]"):
        try:
            b.click()
            time.sleep(0.5)
        except Exception:
            pass


def api(d, path):
    """GET an Open WebUI API path from the page, with its session token."""
    js = """const cb = arguments[arguments.length - 1];
fetch(arguments[0], {headers: {Authorization: 'Bearer ' + localStorage.token}})
  .then(r => r.text().then(t => cb({status: r.status, body: t}))).catch(e => cb({status: 0, body: String(e)}));"""
    r = d.execute_async_script(js, path)
    try:
        return r["status"], json.loads(r["body"])
    except ValueError:
        return r["status"], r["body"]


def open_new_chat(d, base, timeout):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    d.get(base + "/")
    WebDriverWait(d, timeout).until(EC.presence_of_element_located((By.ID, "chat-input")))
    WebDriverWait(d, timeout).until(lambda d: d.execute_script("return !!localStorage.token"))
    time.sleep(1.5)  # the What's New dialog comes up a moment after the page
    dismiss_dialogs(d)


def pick_model(d, model_id, timeout):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    w = WebDriverWait(d, timeout)
    w.until(EC.element_to_be_clickable((By.ID, "model-selector-model-button"))).click()
    option = (By.CSS_SELECTOR, f'button[role="option"][aria-label="Select {model_id} model"]')
    try:
        w.until(EC.element_to_be_clickable(option)).click()
    except Exception:
        # A long list: search for it.
        box = d.find_element(By.CSS_SELECTOR, 'input[placeholder="Search a model"]')
        box.send_keys(model_id)
        w.until(EC.element_to_be_clickable(option)).click()
    w.until(lambda d: d.find_element(By.ID, "model-selector-model-button").get_attribute("aria-label")
            == f"Selected model: {model_id}")
    d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)


def send(d, text, timeout):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    box = WebDriverWait(d, timeout).until(EC.element_to_be_clickable((By.ID, "chat-input")))
    box.click()
    box.send_keys(text)
    WebDriverWait(d, timeout).until(lambda d: text in box.text)
    box.send_keys(Keys.ENTER)


def wait_turn(d, n_user, timeout):
    """Waits until the page shows `n_user` user messages, an assistant message after the
    last, no Stop button, no streaming cursor and the reply's action buttons. Returns the
    snapshot, whether it finished in time, and when the reply first showed and last changed."""
    t0 = time.time()
    deadline = t0 + timeout
    snap, settled = None, 0
    timing = {"first_text_seconds": None, "last_change_seconds": None}
    last_text = None
    while time.time() < deadline:
        try:
            snap = d.execute_script(SNAPSHOT_JS)
        except Exception:  # a stale node while the page re-renders
            time.sleep(0.5)
            continue
        msgs = snap["messages"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        if len(users) >= n_user and msgs[-1]["role"] == "assistant":
            txt = (msgs[-1].get("text") or "") + (msgs[-1].get("error") or "")
            if txt and timing["first_text_seconds"] is None:
                timing["first_text_seconds"] = round(time.time() - t0, 1)
            if txt != last_text:
                last_text = txt
                timing["last_change_seconds"] = round(time.time() - t0, 1)
        done = (len(users) >= n_user and msgs[-1]["role"] == "assistant" and not snap["stop"]
                and not msgs[-1]["streaming"] and (msgs[-1]["buttons"] or msgs[-1]["error"]))
        settled = settled + 1 if done else 0
        if settled >= 3:  # three polls in a row: not a gap between two stream events
            return snap, True, timing
        time.sleep(0.5)
    return snap, False, timing


def run_connection(d, base, name, model_id, out, proxy, turn_timeout, settle_timeout):
    res = {"connection": name, "model": model_id, "turns": [], "screenshots": [], "ok": True}
    try:
        open_new_chat(d, base, 120)
        pick_model(d, model_id, 60)
    except Exception as e:
        res.update(ok=False, setup_error=f"{type(e).__name__}: {e}")
        path = os.path.join(out, f"{name}-setup.png")
        d.save_screenshot(path)
        res["screenshots"].append(path)
        return res
    for i, q in enumerate(QUESTIONS, 1):
        t0 = time.time()
        turn = {"question": q}
        try:
            send(d, q, 60)
            snap, finished, timing = wait_turn(d, i, turn_timeout)
            # seconds from Enter: the reply's first text, its last change (the answer
            # complete), and "seconds" below: the page idle again (no Stop button).
            turn.update({"reply_" + k: v for k, v in timing.items()})
        except Exception as e:
            snap, finished = None, False
            turn["driver_error"] = f"{type(e).__name__}: {e}"
        turn["seconds"] = round(time.time() - t0, 1)
        last = (snap or {}).get("messages", [{}])[-1] if snap and snap.get("messages") else {}
        turn["reply"] = last.get("text") if last.get("role") == "assistant" else None
        turn["error"] = last.get("error") if last.get("role") == "assistant" else None
        turn["finished"] = finished
        if snap and snap.get("toasts"):
            turn["toasts"] = snap["toasts"]
        turn["ok"] = bool(finished and not turn["error"] and turn["reply"] and "driver_error" not in turn)
        path = os.path.join(out, f"{name}-turn{i}.png")
        d.save_screenshot(path)
        res["screenshots"].append(path)
        res["turns"].append(turn)
        if not turn["ok"]:
            res["ok"] = False
    # Let the side requests (title, tags, follow-ups) finish, then the final picture.
    deadline = time.time() + settle_timeout
    time.sleep(2)
    while time.time() < deadline and proxy.busy():
        time.sleep(1)
    time.sleep(2)
    snap = d.execute_script(SNAPSHOT_JS)
    res["page"] = {"title": d.title, "url": d.current_url, "toasts": snap.get("toasts"),
                   "messages": [{k: m.get(k) for k in ("role", "text", "error")} for m in snap["messages"]]}
    m = re.search(r"/c/([0-9a-f-]{36})", d.current_url)
    if m:  # what Open WebUI stored for the chat: each reply's content and error
        status, chat = api(d, f"/api/v1/chats/{m.group(1)}")
        if status == 200 and isinstance(chat, dict):
            res["chat_title"] = chat.get("title")
            hist = ((chat.get("chat") or {}).get("history") or {}).get("messages") or {}
            res["stored"] = [{"role": v.get("role"), "content": v.get("content"), "error": v.get("error"),
                              "done": v.get("done"), "followUps": v.get("followUps"),
                              "usage": v.get("usage")} for v in sorted(hist.values(), key=lambda v: v.get("timestamp", 0))]
            res["tags"] = [t.get("name") if isinstance(t, dict) else t for t in (chat.get("meta") or {}).get("tags") or []] \
                or (chat.get("chat") or {}).get("tags")
    path = os.path.join(out, f"{name}-final.png")
    d.save_screenshot(path)
    res["screenshots"].append(path)
    with open(os.path.join(out, f"{name}-final.html"), "w") as f:
        f.write(d.page_source)
    return res


def strata_log_findings(path):
    """Warnings, errors and 4xx/5xx responses in Strata's log."""
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            if re.search(r"\b(WARN|ERROR)\b", line) or re.search(r"status=[45]\d\d", line):
                found.append(line.rstrip()[:400])
    return found[:200]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--model", required=True, help="the GGUF (or any --model SPEC) to serve")
    ap.add_argument("--open-webui", required=True, help="the open-webui executable in its venv")
    ap.add_argument("--out", required=True, help="directory for screenshots, logs and summary.json")
    ap.add_argument("--strata-arg", action="append", default=[], help="an extra argument to `strata serve` (repeatable)")
    ap.add_argument("--strata-log-level", default="info,tower_http=debug",
                    help="strata's --log-level (default: info, with each request at debug)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    ap.add_argument("--connections", default="ollama,openai", help="which connections to chat on, in order")
    ap.add_argument("--turn-timeout", type=float, default=600, help="seconds one turn may take")
    ap.add_argument("--settle-timeout", type=float, default=300,
                    help="seconds to wait after the last turn for the side requests (title, tags, follow-ups)")
    ap.add_argument("--keep-temp", action="store_true", help="keep the temp dir (STRATA_HOME, Open WebUI's DATA_DIR)")
    args = ap.parse_args()

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    for f in ("requests.jsonl",):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    tmp = tempfile.mkdtemp(prefix="owui-e2e-")
    strata = webui = driver = None
    summary = {"strata_args": args.strata_arg, "connections": [], "out": out}
    code = 0
    try:
        sport = free_port()
        senv = dict(os.environ, STRATA_HOME=os.path.join(tmp, "strata-home"))
        senv.pop("RUST_LOG", None)
        cmd = [args.strata, "serve", "--model", args.model, "--port", str(sport),
               "--log-level", args.strata_log_level] + args.strata_arg
        summary["strata_command"] = cmd
        strata = subprocess.Popen(cmd, env=senv, stdout=open(os.path.join(out, "strata.log"), "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"http://127.0.0.1:{sport}/health", strata, 300, "strata")
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/api/ps") as r:
            ps = json.load(r)
        summary["strata_context_length"] = [m.get("context_length") for m in ps.get("models", [])]

        proxy = Proxy(f"http://127.0.0.1:{sport}", os.path.join(out, "requests.jsonl"))
        proxy.start()
        upstream = f"http://127.0.0.1:{proxy.port}"

        wport = free_port()
        wdata = os.path.join(tmp, "open-webui-data")
        os.makedirs(wdata)
        wenv = dict(os.environ)
        wenv.update({
            "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "WEBUI_AUTH": "False", "DATA_DIR": wdata,
            "WEBUI_SECRET_KEY": secrets.token_hex(16),
            "ENABLE_OLLAMA_API": "true", "OLLAMA_BASE_URL": upstream,
            "ENABLE_OPENAI_API": "true", "OPENAI_API_BASE_URL": upstream + "/v1", "OPENAI_API_KEY": "unused",
            "OPENAI_API_CONFIGS": json.dumps({"0": {"prefix_id": OPENAI_PREFIX}}),
            # No local sentence-transformers model (it would be looked for offline, slowly):
            # embeddings, should any be asked for, go to Strata.
            "RAG_EMBEDDING_ENGINE": "ollama", "RAG_OLLAMA_BASE_URL": upstream,
            "ENABLE_VERSION_UPDATE_CHECK": "false", "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true",
            "ANONYMIZED_TELEMETRY": "false",
        })
        for k in ("OLLAMA_BASE_URLS", "OPENAI_API_BASE_URLS", "OPENAI_API_KEYS", "OLLAMA_API_CONFIGS"):
            wenv.pop(k, None)
        webui = subprocess.Popen([args.open_webui, "serve", "--host", "127.0.0.1", "--port", str(wport)],
                                 env=wenv, cwd=tmp, stdout=open(os.path.join(out, "open-webui.log"), "w"),
                                 stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"http://127.0.0.1:{wport}/health", webui, 600, "Open WebUI")
        base = f"http://127.0.0.1:{wport}"
        try:
            from importlib.metadata import version
            summary["open_webui_version"] = version("open-webui")
        except Exception:
            pass

        driver = make_driver(args, os.path.join(tmp, "chromium-profile"))
        open_new_chat(driver, base, 120)
        status, models = api(driver, "/api/models")
        if status != 200:
            raise RuntimeError(f"/api/models: {status} {models}")
        models = models.get("data", [])
        summary["models_listed"] = [{"id": m["id"], "owned_by": m.get("owned_by"),
                                     "connection_type": m.get("connection_type")} for m in models]
        by_conn = {
            "ollama": next((m["id"] for m in models if m.get("owned_by") == "ollama"), None),
            "openai": next((m["id"] for m in models if m.get("owned_by") == "openai"
                            and m["id"].startswith(OPENAI_PREFIX + ".")), None),
        }
        for name in [c.strip() for c in args.connections.split(",") if c.strip()]:
            if not by_conn.get(name):
                summary["connections"].append({"connection": name, "ok": False,
                                               "setup_error": "Open WebUI lists no model on this connection"})
                continue
            summary["connections"].append(run_connection(driver, base, name, by_conn[name], out, proxy,
                                                         args.turn_timeout, args.settle_timeout))
        summary["requests_to_strata"] = proxy.summary()
        summary["requests_detail"] = [
            {k: e.get(k) for k in ("method", "path", "kind", "model", "stream", "messages", "tools", "status",
                                   "first_byte_seconds", "seconds", "usage", "error_body") if e.get(k) is not None}
            for e in proxy.entries if e["method"] == "POST"]
        code = 0 if all(c.get("ok") for c in summary["connections"]) else 1
    except Exception as e:
        summary["setup_error"] = f"{type(e).__name__}: {e}"
        code = 2
        if driver is not None:
            try:
                driver.save_screenshot(os.path.join(out, "setup-error.png"))
            except Exception:
                pass
    finally:
        if driver is not None:
            try:
                driver.quit()
            except Exception:
                pass
        stop(webui, "Open WebUI")
        stop(strata, "strata")
        if os.path.exists(os.path.join(out, "strata.log")):
            summary["strata_log_warnings_and_errors"] = strata_log_findings(os.path.join(out, "strata.log"))
        if not args.keep_temp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            summary["temp_dir"] = tmp
    summary["ok"] = code == 0
    text = json.dumps(summary, indent=2, ensure_ascii=False)
    with open(os.path.join(out, "summary.json"), "w") as f:
        f.write(text + "\n")
    print(text)
    sys.exit(code)


if __name__ == "__main__":
    main()
