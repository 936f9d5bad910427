"""A minimal OpenAI-completions client and server launcher on the standard library, for the
GPU scripts (the GPU machine has no network to install one)."""
import http.client
import json
import re
import subprocess
import time


def start_server(binary, model, devices, port, log_path, extra=()):
    """Starts `tessera serve` and waits for /readyz (up to 10 minutes)."""
    return _start(
        [binary, "serve", "--model", model, "--devices", devices,
         "--tensor-parallel-size", str(len(devices.split(","))),
         "--port", str(port), "--served-model-name", "m", *extra],
        port, log_path, "/readyz", "tessera")


def start_llama_server(binary, gguf, port, log_path, slots, slot_tokens):
    """Starts llama.cpp's `llama-server` with every layer on the GPU and `slots` parallel
    slots of `slot_tokens` context each (continuous batching is its default), and waits
    for /health (up to 10 minutes)."""
    return _start(
        [binary, "--model", gguf, "--n-gpu-layers", "999", "--parallel", str(slots),
         "--ctx-size", str(slots * slot_tokens), "--host", "127.0.0.1", "--port", str(port),
         "--alias", "m"],
        port, log_path, "/health", "llama-server")


def _start(argv, port, log_path, ready_path, name):
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {log_path}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", ready_path)
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{name} did not become ready")


def stop_server(proc):
    """SIGTERM, then the exit code (or 'killed' after a minute)."""
    proc.terminate()
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed"


def complete(port, body):
    """POST /v1/completions. Streams when body["stream"]; returns (text, finish_reason,
    ended_with_done, token_times) with the arrival time of each streamed chunk."""
    started = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    if not body.get("stream"):
        doc = json.loads(resp.read())
        return doc["choices"][0]["text"], doc["choices"][0]["finish_reason"], True, [time.time() - started]
    text, finish, done, times = "", None, False, []
    for chunk in _events(resp):
        if chunk is None:
            done = True
            break
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        for choice in chunk.get("choices", []):
            if choice.get("text"):
                times.append(time.time() - started)
            text += choice.get("text", "")
            finish = choice.get("finish_reason") or finish
    return text, finish, done, times


def _events(resp):
    """The JSON objects of a server-sent event stream, then None for its `[DONE]`."""
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            yield None
            return
        yield json.loads(data)


def metric(port, name):
    """One sample of a Prometheus metric from /metrics, or None."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    body = resp.read().decode(errors="replace")
    if resp.status != 200:
        return None
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def stream_events(port, body, on_token=None):
    """POST a streaming /v1/completions and read it to its end, errors included: returns
    (text, error, ended_with_done, seconds) where error is the stream's error object (or
    the non-200 reply's) or None. `on_token(count)` is called as tokens arrive."""
    started = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raw = resp.read()
        try:
            error = json.loads(raw).get("error")
        except ValueError:
            error = {"message": raw[:300].decode(errors="replace")}
        return "", {**(error or {}), "status": resp.status}, False, time.time() - started
    text, error, done, tokens = "", None, False, 0
    try:
        for chunk in _events(resp):
            if chunk is None:
                done = True
                break
            if "error" in chunk:
                error = chunk["error"]
                continue
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    tokens += 1
                    if on_token:
                        on_token(tokens)
                text += choice.get("text", "")
    except (OSError, http.client.HTTPException) as e:
        error = error or {"message": f"connection: {e}"}
    return text, error, done, time.time() - started


def ready_status(port):
    """The status /readyz answers, or None when nothing answers."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    except OSError:
        return None
