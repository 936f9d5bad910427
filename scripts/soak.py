"""Soak test for `tessera serve` (run through scripts/soak, which makes the venv).

N clients loop for M minutes: streaming and non-streaming, completions and chat, random
max_tokens, random disconnects (mid-stream, or before a non-streaming answer), and
periodic bursts above the queue limit. Every request is classified:

  answered      a complete answer: one finish_reason, one [DONE] (streams), status 200
  refused       429 or 503 before any answer
  disconnected  the client hung up on purpose
  errored       any other status, or an error event in a stream
  lost          none of the above (connection reset, stream cut without [DONE], timeout)
  duplicated    two finish_reasons or two [DONE] in one stream, data after [DONE], or
                a response id seen twice

Checks: lost == 0, duplicated == 0, errored == 0, at least one answer, KV blocks in use
back at the idle baseline, and no upward trend in the server's VmRSS over the second half.
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import httpx

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "List three colours:",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Explain why the sky is blue in one sentence.",
    "The quick brown fox",
    "Count from one to ten:",
]
KV_METRIC = "tessera_kv_blocks_in_use"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--url", help="an already running server instead of starting one")
    p.add_argument("--pid", type=int, help="the server's pid, for RSS with --url")
    p.add_argument("--binary", help="tessera binary to start")
    p.add_argument("--model", help="model file for the started server")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-waiting", type=int, default=24)
    p.add_argument("--burst-every", type=float, default=20.0, help="seconds between bursts")
    p.add_argument("--burst-size", type=int, default=64)
    p.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures here as JSON")
    return p.parse_args()


class Tally:
    def __init__(self):
        self.counts = {k: 0 for k in (
            "sent", "answered", "refused_429", "refused_503", "disconnected",
            "errored", "lost", "duplicated")}
        self.ids = set()
        self.examples = {}

    def add(self, outcome, detail=None):
        self.counts[outcome] += 1
        if detail and outcome in ("errored", "lost", "duplicated"):
            self.examples.setdefault(outcome, []).append(detail)
            del self.examples[outcome][5:]

    def response_id(self, rid):
        """False (and counted as duplicated) when `rid` was seen before."""
        if rid in self.ids:
            self.add("duplicated", f"response id {rid} seen twice")
            return False
        self.ids.add(rid)
        return True


def request_body(rng, model, stream):
    chat = rng.random() < 0.5
    body = {
        "model": model,
        "max_tokens": rng.randint(1, 64),
        "temperature": rng.choice([0, 0.7, 1.0]),
        "stream": stream,
    }
    prompt = rng.choice(PROMPTS)
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


async def non_streaming(client, tally, path, body, hang_up_after):
    try:
        call = client.post(path, json=body)
        if hang_up_after is None:
            r = await call
        else:
            try:
                r = await asyncio.wait_for(call, hang_up_after)
            except asyncio.TimeoutError:
                tally.add("disconnected")
                return
    except httpx.HTTPError as e:
        tally.add("lost", f"{path}: {type(e).__name__}: {e}")
        return
    classify_status(tally, r.status_code, r.text, path)
    if r.status_code != 200:
        return
    try:
        data = r.json()
        finish = data["choices"][0]["finish_reason"]
        rid = data["id"]
    except (ValueError, KeyError, IndexError) as e:
        tally.add("lost", f"{path}: unreadable answer ({e}): {r.text[:200]}")
        return
    if not finish:
        tally.add("lost", f"{path}: no finish_reason: {r.text[:200]}")
    elif tally.response_id(rid):
        tally.add("answered")


def classify_status(tally, status, text, path):
    if status == 200:
        return
    if status == 429:
        tally.add("refused_429")
    elif status == 503:
        tally.add("refused_503")
    else:
        tally.add("errored", f"{path}: {status} {text[:200]}")


async def streaming(client, tally, path, body, hang_up_after_events):
    finishes = 0
    dones = 0
    events = 0
    ids = set()
    error = None
    after_done = False
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                classify_status(tally, r.status_code, text, path)
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if dones:
                    after_done = True
                if data == "[DONE]":
                    dones += 1
                    continue
                events += 1
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    continue
                if "id" in chunk:
                    ids.add(chunk["id"])
                for choice in chunk.get("choices", []):
                    if choice.get("finish_reason"):
                        finishes += 1
                if hang_up_after_events is not None and events >= hang_up_after_events:
                    tally.add("disconnected")
                    return
    except (httpx.HTTPError, ValueError) as e:
        tally.add("lost", f"{path} stream: {type(e).__name__}: {e}")
        return
    where = f"{path} stream ({events} events)"
    if dones > 1 or finishes > 1 or after_done or len(ids) > 1:
        tally.add("duplicated", f"{where}: {dones} [DONE], {finishes} finish_reasons, "
                  f"ids {sorted(ids)}, data after [DONE]: {after_done}")
    elif error is not None:
        tally.add("errored", f"{where}: error event {error}")
    elif dones == 0 or finishes == 0:
        tally.add("lost", f"{where}: {dones} [DONE], {finishes} finish_reasons")
    elif all(tally.response_id(i) for i in ids):
        tally.add("answered")


async def one_request(client, tally, rng, model, burst=False):
    stream = (not burst) and rng.random() < 0.6
    path, body = request_body(rng, model, stream)
    tally.add("sent")
    if stream:
        hang_up = rng.randint(1, 8) if rng.random() < 0.2 else None
        await streaming(client, tally, path, body, hang_up)
    else:
        hang_up = rng.uniform(0.05, 1.0) if (not burst and rng.random() < 0.05) else None
        await non_streaming(client, tally, path, body, hang_up)


async def client_loop(client, tally, rng, model, until):
    while time.monotonic() < until:
        refused = tally.counts["refused_429"] + tally.counts["refused_503"]
        await one_request(client, tally, rng, model)
        if tally.counts["refused_429"] + tally.counts["refused_503"] > refused:
            # Refused (this client or another meanwhile): honour Retry-After (1 s), jittered.
            await asyncio.sleep(rng.uniform(0.5, 1.5))
        else:
            await asyncio.sleep(rng.uniform(0, 0.2))


async def bursts(client, tally, rng, model, until, every, size):
    while True:
        await asyncio.sleep(every)
        if time.monotonic() >= until:
            return
        await asyncio.gather(*(one_request(client, tally, rng, model, burst=True)
                               for _ in range(size)))


def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def sample_rss(pid, every, samples, stop):
    start = time.monotonic()
    while not stop.is_set():
        kib = vm_rss_kib(pid)
        if kib is not None:
            samples.append((time.monotonic() - start, kib))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


def slope_per_minute(points):
    """Least-squares slope of (seconds, KiB) points, in KiB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mx) * (v - my) for t, v in points)
    return cov / var * 60.0


async def kv_blocks_in_use(client):
    r = await client.get("/metrics")
    m = re.search(rf"^{KV_METRIC}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", r.text, re.M)
    if not m:
        raise RuntimeError(f"no {KV_METRIC} in /metrics")
    return float(m.group(1))


async def served_model(client):
    r = await client.get("/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def start_server(args):
    cmd = [args.binary, "serve", "--port", "0", "--model", args.model,
           "--max-num-seqs", str(args.max_num_seqs), "--max-waiting", str(args.max_waiting),
           "--max-model-len", "1024", "--kv-cache-memory-mib", "64"]
    print("starting:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
        if time.monotonic() > deadline:
            break
    else:
        raise RuntimeError("the server exited before listening")
    # Keep draining its log so it never blocks on a full pipe; remember error lines.
    errors = []

    def drain():
        for line in proc.stderr:
            if "ERROR" in line or "panicked" in line:
                errors.append(line.rstrip())
    import threading
    threading.Thread(target=drain, daemon=True).start()
    return proc, url, errors


async def wait_ready(client, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError("the server never became ready")


async def soak(args, url, pid):
    rng = random.Random(args.seed)
    tally = Tally()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(300.0, connect=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        await wait_ready(client)
        model = await served_model(client)
        baseline = await kv_blocks_in_use(client)
        print(f"ready: model {model}, idle {KV_METRIC} = {baseline:g}", file=sys.stderr)
        samples = []
        stop = asyncio.Event()
        rss_task = asyncio.create_task(sample_rss(pid, args.rss_every, samples, stop)) \
            if pid else None
        started = time.monotonic()
        until = started + args.minutes * 60

        async def progress():
            while True:
                await asyncio.sleep(60)
                c = tally.counts
                print(f"[{(time.monotonic() - started) / 60:.0f} min] {json.dumps(c)}",
                      file=sys.stderr)
        progress_task = asyncio.create_task(progress())
        clients = [client_loop(client, tally, random.Random(rng.random()), model, until)
                   for _ in range(args.clients)]
        await asyncio.gather(
            *clients,
            bursts(client, tally, random.Random(rng.random()), model, until,
                   args.burst_every, args.burst_size))
        progress_task.cancel()
        elapsed = time.monotonic() - started
        # Disconnected sequences are freed on the engine's next step; give it a moment.
        after = await kv_blocks_in_use(client)
        for _ in range(60):
            if after <= baseline:
                break
            await asyncio.sleep(0.5)
            after = await kv_blocks_in_use(client)
        stop.set()
        if rss_task:
            await rss_task
    return tally, baseline, after, samples, elapsed


def report(args, tally, baseline, after, samples, elapsed):
    c = tally.counts
    figures = {"clients": args.clients, "minutes": round(elapsed / 60, 2), **c,
               "kv_blocks_in_use_idle_before": baseline, "kv_blocks_in_use_after": after}
    failures = []
    for key in ("lost", "duplicated", "errored"):
        if c[key]:
            failures.append(f"{key} = {c[key]}: {tally.examples.get(key)}")
    if c["answered"] == 0:
        failures.append("no request was answered")
    if after > baseline:
        failures.append(f"{KV_METRIC} is {after:g} after the run, {baseline:g} before")
    if samples:
        values = [v for _, v in samples]
        second_half = [p for p in samples if p[0] >= samples[-1][0] / 2]
        slope = slope_per_minute(second_half)
        half_minutes = (second_half[-1][0] - second_half[0][0]) / 60 if second_half else 0
        growth = slope * half_minutes
        figures.update({
            "rss_samples": len(values), "rss_first_mib": round(values[0] / 1024, 1),
            "rss_last_mib": round(values[-1] / 1024, 1),
            "rss_max_mib": round(max(values) / 1024, 1),
            "rss_slope_second_half_mib_per_min": round(slope / 1024, 3),
        })
        # An upward trend: the fitted line grows by more than 5% of the first sample
        # across the second half.
        if growth > 0.05 * values[0]:
            failures.append(f"VmRSS trends upward: {slope / 1024:.2f} MiB/min over the "
                            f"second half ({growth / 1024:.1f} MiB)")
    else:
        figures["rss_samples"] = 0
    figures["ok"] = not failures
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return not failures


def main():
    args = parse_args()
    proc = None
    server_errors = []
    if args.url:
        url, pid = args.url, args.pid
    else:
        if not (args.binary and args.model):
            sys.exit("give --url, or --binary and --model")
        proc, url, server_errors = start_server(args)
        pid = proc.pid
    try:
        tally, baseline, after, samples, elapsed = asyncio.run(soak(args, url, pid))
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            print(f"server exited with {code}", file=sys.stderr)
    ok = report(args, tally, baseline, after, samples, elapsed)
    if server_errors:
        print(f"server logged {len(server_errors)} error lines, e.g.:", file=sys.stderr)
        for line in server_errors[:5]:
            print("  " + line, file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
