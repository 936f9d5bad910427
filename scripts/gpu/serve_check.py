"""`tessera serve` on CUDA under 16 concurrent streaming clients (for scripts/test-gpu):
each request must get the text it gets alone, every stream must end with [DONE], and the
KV blocks in use must return to zero. Only the standard library: the GPU machine has no
network to install a client.

  python3 serve_check.py TESSERA_BINARY MODEL_DIR DEVICES PORT

Prints `GPU-CHECK | ... | ... | ...` lines; exits 1 when a check fails.
"""
import http.client
import json
import re
import subprocess
import sys
import threading
import time

CLIENTS = 16
MAX_TOKENS = 40


def request(port, body, stream):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    if not stream:
        doc = json.loads(resp.read())
        return doc["choices"][0]["text"], doc["choices"][0]["finish_reason"], True
    text, finish, done = "", None, False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        for choice in chunk.get("choices", []):
            text += choice.get("text", "")
            finish = choice.get("finish_reason") or finish
    return text, finish, done


def metric(port, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def wait_ready(port, proc, deadline):
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tessera exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("tessera did not become ready")


def check(name, figure, bound, ok):
    print(f"GPU-CHECK | {name} | {figure} | {bound}", flush=True)
    return ok


def main():
    binary, model, devices, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    log = open(f"serve-{port}.log", "w")
    proc = subprocess.Popen(
        [binary, "serve", "--model", model, "--devices", devices,
         "--tensor-parallel-size", str(len(devices.split(","))),
         "--port", str(port), "--kv-cache-memory-mib", "256", "--served-model-name", "m"],
        stdout=log, stderr=subprocess.STDOUT)
    ok = True
    try:
        wait_ready(port, proc, time.time() + 300)
        words = ("Paris Rome Madrid Berlin Vienna London server blocks tensor fox numbers "
                 "colours river city capital memory").split()
        prompts = [f"The {words[i]} and the {words[(i * 7 + 3) % len(words)]} are" for i in range(CLIENTS)]

        def body(p, stream):
            return {"model": "m", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "stream": stream, "ignore_eos": True}

        results = [None] * CLIENTS
        errors = []

        def client(i):
            try:
                results[i] = request(port, body(prompts[i], True), True)
            except Exception as e:  # noqa: BLE001 - reported as a failed check
                errors.append(f"client {i}: {e}")

        started = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - started
        alone = [request(port, body(p, False), False) for p in prompts]
        same = sum(1 for r, a in zip(results, alone) if r is not None and r[0] == a[0])
        done = sum(1 for r in results if r is not None and r[2])
        ok &= check(f"serve on {devices}: {CLIENTS} concurrent streams vs each alone",
                    f"{same}/{CLIENTS} identical texts, {done}/{CLIENTS} ended with [DONE], "
                    f"{CLIENTS * MAX_TOKENS / wall:.0f} tok/s together; errors: {errors[:2]}",
                    f"{CLIENTS}/{CLIENTS}, {CLIENTS}/{CLIENTS}",
                    same == CLIENTS and done == CLIENTS and not errors)
        for i, (r, a) in enumerate(zip(results, alone)):
            if r is None or r[0] != a[0]:
                print(f"  prompt {i}: concurrent {r[0] if r else None!r} alone {a[0]!r}", flush=True)
        in_use = None
        for _ in range(20):
            in_use = metric(port, "tessera_kv_blocks_in_use")
            if in_use == 0:
                break
            time.sleep(0.25)
        ok &= check(f"serve on {devices}: KV blocks in use after the clients finished",
                    f"{in_use}", "0", in_use == 0)
    except Exception as e:  # noqa: BLE001
        ok &= check(f"serve on {devices}", f"failed: {e}", "runs", False)
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "killed"
        ok &= check(f"serve on {devices}: exit after SIGTERM", f"{code}", "0", code == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
