"""Decode speed of `tessera serve`, or of llama.cpp's `llama-server` beside it, on a GPU
(for scripts/bench-gpu): one streaming client, then 16 and 64 at once, each generating
MAX_TOKENS tokens (EOS ignored) after a short prompt. Each client is its own process
(threads of one Python process contend for its interpreter lock and become the
bottleneck at 64 streams). Prints one JSON object:

  single_decode_tok_s  tokens after the first, over the time between the first and last
  clients_N_tok_s      every client's tokens over the wall time of the whole run
  clients_N_ttft_s     median time to the first token under that load
  clients_N_step_ms    mean engine step time (the server's tessera_step_duration_seconds;
                       none for llama-server)

  python3 bench_serve.py TESSERA_BINARY MODEL DEVICES PORT [TOKENIZER]
  python3 bench_serve.py --llama-server LLAMA_SERVER_BINARY GGUF PORT

llama-server runs with 64 slots (the most clients at once), each with room for the
prompt and MAX_TOKENS, every layer on the GPU, its defaults otherwise.
"""
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from client import complete, metric, start_llama_server, start_server, stop_server

MAX_TOKENS = 256
CLIENTS = (16, 64)
# 0: greedy (rows reduced to their arg-max on the GPU); above 0: sampled (rows reduced to
# their sampling candidates), what chat clients send by default.
TEMPERATURE = float(os.environ.get("TESSERA_BENCH_TEMPERATURE", "0"))
# Above 0: every token's log-probability and this many most likely tokens (rows reduced
# to their arg-max, candidates and log-sum-exp), what evaluation clients send.
LOGPROBS = int(os.environ.get("TESSERA_BENCH_LOGPROBS", "0"))


def one_client(args):
    port, prompt = args
    body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": TEMPERATURE, "stream": True, "ignore_eos": True}
    if LOGPROBS > 0:
        body["logprobs"] = LOGPROBS
    try:
        return complete(port, body), None
    except Exception as e:  # noqa: BLE001 - reported in the output
        return None, str(e)


def run_clients(port, n, prompts):
    """n clients at once; returns (output tok/s, median TTFT, errors, results, mean step ms)."""
    steps0 = metric(port, "tessera_step_duration_seconds_count") or 0
    secs0 = metric(port, "tessera_step_duration_seconds_sum") or 0
    with ProcessPoolExecutor(max_workers=n) as pool:
        # Start the processes before the clock does.
        list(pool.map(time.sleep, [0] * n))
        started = time.time()
        outcomes = list(pool.map(one_client, [(port, prompts[i % len(prompts)]) for i in range(n)]))
        wall = time.time() - started
    steps = (metric(port, "tessera_step_duration_seconds_count") or 0) - steps0
    secs = (metric(port, "tessera_step_duration_seconds_sum") or 0) - secs0
    done = [r for r, _ in outcomes if r is not None]
    errors = [e for _, e in outcomes if e is not None]
    # With EOS ignored every finished request generated exactly MAX_TOKENS tokens.
    tokens = sum(MAX_TOKENS for r in done if r[1] == "length")
    ttft = statistics.median(r[3][0] for r in done if r[3]) if done else None
    step_ms = 1000 * secs / steps if steps else None
    return tokens / wall, ttft, errors, done, step_ms


def main():
    started = time.time()
    if sys.argv[1] == "--llama-server":
        binary, model, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
        devices, server = "cuda:0", "llama-server"
        proc = start_llama_server(binary, model, port, f"bench-{port}.log", max(CLIENTS),
                                  MAX_TOKENS + 256)
    else:
        binary, model, devices, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        extra = ["--tokenizer", sys.argv[5]] if len(sys.argv) > 5 else []
        # More flags for tessera serve (the benchmark's A/B rows), split on spaces.
        extra += os.environ.get("TESSERA_BENCH_SERVE_ARGS", "").split()
        server = "tessera"
        proc = start_server(binary, model, devices, port, f"bench-{port}.log", extra)
    load_s = time.time() - started
    out = {"server": server, "model": model, "devices": devices, "load_s": round(load_s, 1)}
    try:
        words = "Paris Rome Madrid Berlin Vienna London server blocks tensor fox".split()
        prompts = [f"The {w} and the river are both" for w in words]
        _, _, _, single, step_ms = run_clients(port, 1, prompts)
        out["single_step_ms"] = round(step_ms, 2) if step_ms else None
        times = single[0][3]
        out["single_decode_tok_s"] = round((MAX_TOKENS - 1) / (times[-1] - times[0]), 1)
        out["single_ttft_s"] = round(times[0], 3)
        for n in CLIENTS:
            rate, ttft, errors, _, step_ms = run_clients(port, n, prompts)
            out[f"clients_{n}_tok_s"] = round(rate, 1)
            out[f"clients_{n}_step_ms"] = round(step_ms, 2) if step_ms else None
            out[f"clients_{n}_ttft_s"] = round(ttft, 3) if ttft is not None else None
            if errors:
                out[f"clients_{n}_errors"] = errors[:3]
    finally:
        out["exit"] = stop_server(proc)
    print(json.dumps(out), flush=True)
    print(json.dumps(out), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
