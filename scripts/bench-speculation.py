#!/usr/bin/env python3
"""The load and report of scripts/bench-speculation (standard library only).

    bench-speculation.py run --base-url URL --out FILE
        runs each workload's prompts one at a time (greedy, 128 tokens, EOS ignored) and
        writes output tokens, seconds and the server's vllm:spec_decode_* counters.
    bench-speculation.py report --dir DIR --spec JSON
        prints the markdown table from DIR/{plain,ngram}-R.json.
"""

import argparse
import glob
import json
import statistics
import time
import urllib.request

PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press into a "
    "system that could produce books far faster than any scribe. Within a few decades, "
    "printing shops had spread to more than two hundred cities across Europe."
)
CODE = (
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n"
    "        else:\n            out.append(b[j])\n            j += 1\n"
    "    return out + a[i:] + b[j:]\n"
)
WORKLOADS = {
    "grounded": [
        f"Rewrite the following paragraph exactly, word for word:\n\n{PARAGRAPH}\n\nRewritten:\n",
        f"Copy this function exactly, adding nothing:\n\n{CODE}\nCopy:\n",
    ],
    "free": [
        "Write a short story about a lighthouse keeper.",
        "Explain how photosynthesis works.",
    ],
}
TOKENS = 128


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def counters(base):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_per_pos" not in line:
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            out[name.removeprefix("vllm:spec_decode_num_").removesuffix("_total")] = value
    return out


def run(args):
    base = args.base_url
    post(base, "/v1/completions", {"model": model(base), "prompt": "Hello", "max_tokens": 8})
    result = {}
    for name, prompts in WORKLOADS.items():
        before = counters(base)
        tokens, seconds = 0, 0.0
        for p in prompts:
            started = time.perf_counter()
            reply = post(base, "/v1/completions", {
                "model": model(base), "prompt": p, "max_tokens": TOKENS, "temperature": 0,
                "ignore_eos": True})
            seconds += time.perf_counter() - started
            tokens += reply["usage"]["completion_tokens"]
        after = counters(base)
        result[name] = {"tokens": tokens, "seconds": seconds,
                        "spec": {k: after[k] - before.get(k, 0) for k in after}}
    with open(args.out, "w") as f:
        json.dump(result, f)


def model(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=60) as r:
        return json.loads(r.read())["data"][0]["id"]


def report(args):
    rows = []
    for name in WORKLOADS:
        rate = {}
        spec = {}
        for side in ("plain", "ngram"):
            runs = [json.load(open(p))[name] for p in sorted(glob.glob(f"{args.dir}/{side}-*.json"))]
            rate[side] = statistics.median(r["tokens"] / r["seconds"] for r in runs)
            if side == "ngram":
                spec = {k: sum(r["spec"].get(k, 0) for r in runs) for k in runs[0]["spec"]}
        drafts = spec.get("draft_tokens", 0)
        accepted = spec.get("accepted_tokens", 0)
        rows.append(f"| {name} | {rate['plain']:.1f} | {rate['ngram']:.1f} | "
                    f"{rate['ngram'] / rate['plain']:.2f}× | "
                    f"{accepted / drafts * 100 if drafts else 0:.0f}% of {int(drafts)} |")
    print(f"`--speculative-config '{args.spec}'`, greedy, {TOKENS} tokens a request, one "
          "request at a time; medians over rounds.\n")
    print("| workload | without tok/s | with tok/s | with / without | guesses accepted |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--base-url", required=True)
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--dir", required=True)
    rep.add_argument("--spec", required=True)
    args = p.parse_args()
    {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
