#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server, in the manner of `vllm bench serve`.

At each concurrency level C, C clients each send streaming /v1/completions requests one
after another (a closed loop) until the level's request count is used up. Every request
has its own prompt of about 125 tokens (a window of scripts/bench-data/prompt.txt behind a
request number, so no two share more than a token or two of prefix), greedy sampling and
a fixed max_tokens. The prompts are prose the model continues well past max_tokens; with
--no-stop-ids, a logit_bias of -100 on those tokens also rules out an early end. Tokens are counted from `usage` in the last chunk when the server sends it
(stream_options.include_usage), else from the streamed text chunks; a request that did not
produce exactly max_tokens is counted as `short`.

Reports per level: requests completed, aggregate output tok/s (all output tokens / wall
time of the level), mean and median time to first token, mean inter-token latency (gaps
between streamed chunks after the first), mean time per output token, and p50/p99
end-to-end latency. Prints a markdown table; --json writes everything.

    python bench-serve.py --base-url http://127.0.0.1:8000 --label tessera \\
        --concurrency 1,4,16,64 --requests 8,16,48,128 --max-tokens 64 \\
        --json out.json

With --structured SCHEMA.json it measures the cost of constrained decoding instead: at
the first concurrency level, --rounds rounds each run one level of unconstrained requests
and one of the same kind of requests under `response_format` with that JSON schema, in
alternating order (so drift in the machine's load falls on both alike), every request
with a prompt of its own (no prefix-cache hits across levels). Around each level it reads
the server's /metrics: grammar masks computed and their seconds
(`tessera_structured_output_mask_seconds`), and engine steps and their seconds
(`tessera_step_duration_seconds`). The schema should force outputs longer than
max_tokens (a long minLength string), so both kinds stream the same number of tokens.

    python bench-serve.py --base-url http://127.0.0.1:8000 --label tessera \\
        --concurrency 16 --requests 32 --max-tokens 64 \\
        --structured scripts/bench-data/structured-schema.json --rounds 3

Only for servers on this machine (loopback); every level is bounded in requests.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time

import aiohttp


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def mean(values):
    return statistics.fmean(values) if values else float("nan")


def make_prompts(path, n, words_per_prompt):
    words = open(path, encoding="utf-8").read().split()
    span = len(words) - words_per_prompt
    assert span > 0, "prompt file too short"
    prompts = []
    for i in range(n):
        start = (i * 37) % span
        prompts.append(f"Note {i}: " + " ".join(words[start : start + words_per_prompt]))
    return prompts


class Result:
    __slots__ = ("ok", "error", "ttft", "e2e", "tokens", "chunks", "gaps", "prompt_tokens")

    def __init__(self):
        self.ok = False
        self.error = None
        self.ttft = None
        self.e2e = None
        self.tokens = 0
        self.chunks = 0
        self.gaps = []
        self.prompt_tokens = None


async def one_request(session, args, prompt, extra):
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.no_stop_ids:
        body["logit_bias"] = {str(t): -100 for t in args.no_stop_ids}
    body.update(args.extra_body)
    body.update(extra)
    res = Result()
    usage = None
    start = time.perf_counter()
    last = None
    try:
        async with session.post(args.base_url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            buf = b""
            async for data in resp.content.iter_any():
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    chunk = json.loads(payload)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("text"):
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - start
                        else:
                            res.gaps.append(now - last)
                        last = now
                        res.chunks += 1
        res.e2e = time.perf_counter() - start
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    if usage is not None:
        res.tokens = usage.get("completion_tokens", 0)
        res.prompt_tokens = usage.get("prompt_tokens")
    else:
        res.tokens = res.chunks
    res.ok = res.ttft is not None
    if not res.ok:
        res.error = "no token streamed"
    return res


async def run_level(args, concurrency, n_requests, prompts, extra=None):
    queue = list(range(n_requests))
    results = []

    # A fresh connection per request: llama-server closes a connection after a streamed
    # response without saying so, and a reused one fails the next request.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client():
            while queue:
                i = queue.pop(0)
                results.append(await one_request(session, args, prompts[i], extra or {}))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        duration = time.perf_counter() - start

    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in ok if r.tokens > 1]
    gaps = [g for r in ok for g in r.gaps]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    errors = sorted({r.error for r in results if r.error})
    return {
        "concurrency": concurrency,
        "requests": n_requests,
        "completed": len(ok),
        "failed": n_requests - len(ok),
        "short": sum(1 for r in ok if r.tokens != args.max_tokens),
        "chunks_per_token": (sum(r.chunks for r in ok) / tokens) if tokens else None,
        "duration_s": duration,
        "output_tokens": tokens,
        "output_tok_s": tokens / duration,
        "ttft_mean_ms": mean([r.ttft for r in ok]) * 1e3,
        "ttft_median_ms": percentile([r.ttft for r in ok], 50) * 1e3,
        "ttft_p99_ms": percentile([r.ttft for r in ok], 99) * 1e3,
        "itl_mean_ms": mean(gaps) * 1e3,
        "tpot_mean_ms": mean(tpot) * 1e3,
        "e2e_p50_ms": percentile([r.e2e for r in ok], 50) * 1e3,
        "e2e_p99_ms": percentile([r.e2e for r in ok], 99) * 1e3,
        "prompt_tokens_mean": mean(prompt_tokens) if prompt_tokens else None,
        "errors": errors[:5],
    }


async def check(args, prompt, extra=None):
    """One non-streamed request: the server must honour max_tokens (and the logit bias)."""
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
    }
    if args.no_stop_ids:
        body["logit_bias"] = {str(t): -100 for t in args.no_stop_ids}
    body.update(args.extra_body)
    body.update(extra or {})
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(args.base_url + "/v1/completions", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise SystemExit(f"{args.label}: check request failed: HTTP {resp.status} {text[:300]}")
            out = json.loads(text)
    usage = out.get("usage") or {}
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": out["choices"][0].get("finish_reason"),
        "text_start": out["choices"][0].get("text", "")[:40],
    }


# Server metrics read around each level of --structured (Tessera's names).
SCRAPED = (
    "tessera_structured_output_mask_seconds_count",
    "tessera_structured_output_mask_seconds_sum",
    "tessera_step_duration_seconds_count",
    "tessera_step_duration_seconds_sum",
)


async def scrape(args):
    """The SCRAPED samples of the server's /metrics (unlabelled lines), or {}."""
    async with aiohttp.ClientSession() as session:
        async with session.get(args.base_url + "/metrics") as resp:
            if resp.status != 200:
                return {}
            text = await resp.text()
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in SCRAPED:
            values[parts[0]] = float(parts[1])
    return values


async def structured_rounds(args, prompts):
    """Alternating unconstrained and constrained levels (see the module docstring)."""
    schema = json.load(open(args.structured, encoding="utf-8"))
    constrained = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "bench", "schema": schema, "strict": True},
        }
    }
    c, n = args.concurrency[0], args.requests[0]
    rounds = []
    offset = 0
    for r in range(args.rounds):
        order = ("unconstrained", "constrained") if r % 2 == 0 else ("constrained", "unconstrained")
        this = {}
        for mode in order:
            before = await scrape(args)
            lvl = await run_level(args, c, n, prompts[offset : offset + n], constrained if mode == "constrained" else {})
            after = await scrape(args)
            offset += n
            delta = {k: after[k] - before[k] for k in SCRAPED if k in before and k in after}
            lvl["masks"] = delta.get(SCRAPED[0])
            lvl["mask_seconds"] = delta.get(SCRAPED[1])
            lvl["steps"] = delta.get(SCRAPED[2])
            lvl["step_seconds"] = delta.get(SCRAPED[3])
            this[mode] = lvl
            print(
                f"{args.label}: round {r + 1} {mode}: {lvl['completed']}/{n} done, "
                f"{lvl['output_tok_s']:.1f} tok/s, TPOT {lvl['tpot_mean_ms']:.1f} ms, "
                f"masks {lvl['masks']}, short {lvl['short']}, {lvl['duration_s']:.0f} s",
                file=sys.stderr,
            )
            for e in lvl["errors"]:
                print(f"{args.label}:   error: {e}", file=sys.stderr)
        rounds.append(this)
    return {"constrained_body": constrained, "rounds": rounds, "summary": structured_summary(rounds)}


def structured_summary(rounds):
    """Per mode, over all rounds: tokens over wall time, mean TPOT, step and mask times."""
    out = {}
    for mode in ("unconstrained", "constrained"):
        lvls = [r[mode] for r in rounds]
        tokens = sum(l["output_tokens"] for l in lvls)
        seconds = sum(l["duration_s"] for l in lvls)
        steps = sum(l["steps"] or 0 for l in lvls)
        masks = sum(l["masks"] or 0 for l in lvls)
        mask_seconds = sum(l["mask_seconds"] or 0 for l in lvls)
        out[mode] = {
            "output_tokens": tokens,
            "output_tok_s": tokens / seconds if seconds else None,
            "tpot_mean_ms": mean([l["tpot_mean_ms"] for l in lvls]),
            "short": sum(l["short"] for l in lvls),
            "failed": sum(l["failed"] for l in lvls),
            "step_mean_ms": (sum(l["step_seconds"] or 0 for l in lvls) / steps * 1e3) if steps else None,
            "masks": masks,
            "masks_per_token": masks / tokens if tokens else None,
            "mask_us_per_token": (mask_seconds / masks * 1e6) if masks else None,
            "mask_ms_per_step": (mask_seconds / steps * 1e3) if (steps and masks) else None,
        }
    step_seconds = sum(r["constrained"]["step_seconds"] or 0 for r in rounds)
    if step_seconds:
        # The cost masks add to a step, free of the noise between levels.
        out["constrained"]["mask_share_of_step_percent"] = (
            sum(r["constrained"]["mask_seconds"] or 0 for r in rounds) / step_seconds * 100
        )
    u, c = out["unconstrained"], out["constrained"]
    if u["output_tok_s"] and c["output_tok_s"]:
        out["throughput_ratio"] = c["output_tok_s"] / u["output_tok_s"]
        out["slowdown_percent"] = (1 - out["throughput_ratio"]) * 100
    return out


def structured_table(result):
    def f(v, digits, unit=""):
        return "–" if v is None else f"{v:.{digits}f}{unit}"

    rows = [
        "| round | requests | output tok/s | mean TPOT | mean engine step | masks per token | mask time per token | mask time per step | short |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(result["rounds"]):
        for mode in ("unconstrained", "constrained"):
            l = r[mode]
            steps = l["steps"]
            step_ms = l["step_seconds"] / steps * 1e3 if steps else None
            per_token = l["mask_seconds"] / l["masks"] * 1e6 if l["masks"] else None
            per_step = l["mask_seconds"] / steps * 1e3 if (steps and l["masks"]) else None
            mpt = l["masks"] / l["output_tokens"] if (l["masks"] is not None and l["output_tokens"]) else None
            rows.append(
                f"| {i + 1} {mode} | {l['completed']}/{l['requests']} | {l['output_tok_s']:.1f} | "
                f"{l['tpot_mean_ms']:.1f} ms | {f(step_ms, 1, ' ms')} | {f(mpt, 2)} | "
                f"{f(per_token, 0, ' µs')} | {f(per_step, 2, ' ms')} | {l['short']} |"
            )
    s = result["summary"]
    for mode in ("unconstrained", "constrained"):
        m = s[mode]
        rows.append(
            f"| **all {mode}** | {m['output_tokens']} tokens | **{f(m['output_tok_s'], 1)}** | "
            f"{f(m['tpot_mean_ms'], 1, ' ms')} | {f(m['step_mean_ms'], 1, ' ms')} | {f(m['masks_per_token'], 2)} | "
            f"{f(m['mask_us_per_token'], 0, ' µs')} | {f(m['mask_ms_per_step'], 2, ' ms')} | {m['short']} |"
        )
    if "throughput_ratio" in s:
        slower = s["slowdown_percent"]
        rows.append("")
        rows.append(
            f"Constrained / unconstrained output tok/s: **{s['throughput_ratio']:.3f}** "
            f"({abs(slower):.1f}% {'slower' if slower >= 0 else 'faster'}; target: at most 10% slower)."
        )
    share = s["constrained"].get("mask_share_of_step_percent")
    if share is not None:
        rows.append(
            f"Masks took {share:.2f}% of the constrained levels' engine step time: the cost "
            "constraining adds to a step, which the noise between levels does not blur."
        )
    return "\n".join(rows)


async def model_id(args):
    async with aiohttp.ClientSession() as session:
        async with session.get(args.base_url + "/v1/models") as resp:
            return (await resp.json())["data"][0]["id"]


async def main_async(args):
    if not args.model:
        args.model = await model_id(args)
    if args.structured:
        total = 2 * args.rounds * args.requests[0]
    else:
        total = sum(args.requests)
    prompts = make_prompts(args.prompt_file, total + args.warmup + 1, args.prompt_words)

    chk = await check(args, prompts[-1])
    print(
        f"{args.label}: check: prompt {chk['prompt_tokens']} tokens, "
        f"completion {chk['completion_tokens']}/{args.max_tokens} tokens, "
        f"finish_reason {chk['finish_reason']}",
        file=sys.stderr,
    )
    if chk["completion_tokens"] not in (None, args.max_tokens):
        print(f"{args.label}: WARNING: the check request ended before max_tokens", file=sys.stderr)

    # Warm-up: a few concurrent requests, not measured.
    if args.warmup:
        await run_level(args, min(args.warmup, 4), args.warmup, prompts[total:])

    if args.structured:
        run = await structured_rounds(args, prompts)
        chk_c = await check(args, prompts[-1], run["constrained_body"])
        print(
            f"{args.label}: constrained check: completion {chk_c['completion_tokens']}/{args.max_tokens} "
            f"tokens, finish_reason {chk_c['finish_reason']}, text {chk_c['text_start']!r}",
            file=sys.stderr,
        )
        return {
            "label": args.label,
            "mode": "structured",
            "base_url": args.base_url,
            "model": args.model,
            "max_tokens": args.max_tokens,
            "prompt_words": args.prompt_words,
            "concurrency": args.concurrency[0],
            "requests_per_level": args.requests[0],
            "check": chk,
            "constrained_check": chk_c,
            **run,
        }

    levels = []
    offset = 0
    for c, n in zip(args.concurrency, args.requests):
        lvl = await run_level(args, c, n, prompts[offset : offset + n])
        offset += n
        levels.append(lvl)
        print(
            f"{args.label}: {c:>3} clients: {lvl['completed']}/{n} done, "
            f"{lvl['output_tok_s']:.1f} tok/s, TTFT median {lvl['ttft_median_ms']:.0f} ms, "
            f"ITL {lvl['itl_mean_ms']:.1f} ms, short {lvl['short']}, {lvl['duration_s']:.0f} s",
            file=sys.stderr,
        )
        for e in lvl["errors"]:
            print(f"{args.label}:   error: {e}", file=sys.stderr)
    return {
        "label": args.label,
        "base_url": args.base_url,
        "model": args.model,
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "no_stop_ids": args.no_stop_ids,
        "check": chk,
        "levels": levels,
    }


def table(result):
    rows = [
        "| clients | requests done | output tok/s | mean TTFT | median TTFT | p99 TTFT | mean ITL | p50 E2E | p99 E2E | short |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for l in result["levels"]:
        rows.append(
            f"| {l['concurrency']} | {l['completed']}/{l['requests']} | {l['output_tok_s']:.1f} | "
            f"{l['ttft_mean_ms']:.0f} ms | {l['ttft_median_ms']:.0f} ms | "
            f"{l.get('ttft_p99_ms', float('nan')):.0f} ms | {l['itl_mean_ms']:.1f} ms | "
            f"{l['e2e_p50_ms']:.0f} ms | {l['e2e_p99_ms']:.0f} ms | {l['short']} |"
        )
    return "\n".join(rows)


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--prompt-words", type=int, default=104, help="words per prompt (~125 tokens)")
    ap.add_argument("--concurrency", type=ints, default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=ints, default=[8, 16, 48, 128])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-stop-ids", type=ints, default=[], help="token ids biased by -100 (default: none)")
    ap.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into every request")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--structured", metavar="SCHEMA.json", help="compare constrained with unconstrained decoding")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --structured")
    ap.add_argument("--json")
    args = ap.parse_args()
    if len(args.concurrency) != len(args.requests):
        ap.error("--concurrency and --requests need the same number of entries")
    args.base_url = args.base_url.rstrip("/")
    host = args.base_url.split("//", 1)[-1].split(":")[0].split("/")[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        ap.error("only servers on this machine (127.0.0.1/localhost) are benchmarked")

    result = asyncio.run(main_async(args))
    print(structured_table(result) if args.structured else table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
