#!/usr/bin/env python3
"""The load and report of scripts/bench-speculation (standard library only).

    bench-speculation.py run --plain URL --ngram URL [--peer-plain URL --peer-spec URL]
                             --round R --dir DIR
        runs each workload's prompts one at a time (greedy, 128 tokens, EOS ignored), each
        prompt on every server in turn (the order reversed in even rounds, so all see the
        same load), and writes DIR/{plain,ngram,peer-plain,peer-spec}-R.json: output
        tokens, seconds, the guesses made and kept (Tessera's vllm:spec_decode_*
        counters; llama-server's `timings.draft_n` and `draft_n_accepted`) and how much of
        each answer is copied from its prompt. The peer sides are llama-server without
        and with its own speculation, optional.
    bench-speculation.py report --dir DIR --spec JSON
        prints the markdown tables from DIR/{plain,ngram}-R.json.

"Copied" counts the answer's tokens that lie in a run of COPY_RUN tokens found in the
prompt: the part of the answer an n-gram guess can at best predict from the prompt.
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
PROMPT_NAMES = {"grounded": ["paragraph", "function"], "free": ["story", "photosynthesis"]}
TOKENS = 128
COPY_RUN = 4


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


def tokenize(base, text, special):
    return post(base, "/tokenize", {"prompt": text, "add_special_tokens": special})["tokens"]


def copied(prompt, answer):
    """Tokens of `answer` inside a run of COPY_RUN tokens that occurs in `prompt`."""
    runs = {tuple(prompt[i:i + COPY_RUN]) for i in range(len(prompt) - COPY_RUN + 1)}
    inside = [False] * len(answer)
    for i in range(len(answer) - COPY_RUN + 1):
        if tuple(answer[i:i + COPY_RUN]) in runs:
            inside[i:i + COPY_RUN] = [True] * COPY_RUN
    return sum(inside)


def one(base, prompt, tokenizer, peer=False):
    """One request to `base`; `tokenizer` is a Tessera server's base URL (the same
    tokenizer as the peer's, for the copied share); `peer`: `base` is llama-server."""
    before = {} if peer else counters(base)
    started = time.perf_counter()
    reply = post(base, "/v1/completions", {
        "model": model(base), "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
        "ignore_eos": True})
    seconds = time.perf_counter() - started
    if peer:
        timings = reply.get("timings", {})
        spec = {"draft_tokens": timings.get("draft_n", 0),
                "accepted_tokens": timings.get("draft_n_accepted", 0), "drafts": 0}
    else:
        after = counters(base)
        spec = {k: after[k] - before.get(k, 0) for k in after}
    answer = tokenize(tokenizer, reply["choices"][0]["text"], False)
    return {"tokens": reply["usage"]["completion_tokens"], "seconds": seconds,
            "copied": copied(tokenize(tokenizer, prompt, True), answer) / max(len(answer), 1),
            "spec": spec}


def run(args):
    sides = {"plain": args.plain, "ngram": args.ngram}
    if args.peer_plain and args.peer_spec:
        sides.update({"peer-plain": args.peer_plain, "peer-spec": args.peer_spec})
    order = list(sides) if args.round % 2 else list(reversed(sides))
    for base in sides.values():
        post(base, "/v1/completions", {"model": model(base), "prompt": "Hello", "max_tokens": 8})
    result = {side: {} for side in sides}
    for name, prompts in WORKLOADS.items():
        each = {side: [] for side in sides}
        for p in prompts:
            for side in order:
                each[side].append(one(sides[side], p, args.plain, side.startswith("peer")))
        for side, e in each.items():
            result[side][name] = {
                "tokens": sum(x["tokens"] for x in e), "seconds": sum(x["seconds"] for x in e),
                "copied": statistics.mean(x["copied"] for x in e),
                "spec": {k: sum(x["spec"][k] for x in e) for k in e[0]["spec"]}, "prompts": e}
    for side, r in result.items():
        with open(f"{args.dir}/{side}-{args.round}.json", "w") as f:
            json.dump(r, f)


def model(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=60) as r:
        return json.loads(r.read())["data"][0]["id"]


def report(args):
    rows, steps = [], []
    for name in WORKLOADS:
        rate = {}
        spec = {}
        for side in ("plain", "ngram"):
            runs = [json.load(open(p))[name] for p in sorted(glob.glob(f"{args.dir}/{side}-*.json"))]
            rate[side] = statistics.median(r["tokens"] / r["seconds"] for r in runs)
            if side == "ngram":
                spec = {k: sum(r["spec"].get(k, 0) for r in runs) for k in runs[0]["spec"]}
                tokens = sum(r["tokens"] for r in runs)
                copies = statistics.mean(r.get("copied", 0) for r in runs)
        drafts = spec.get("draft_tokens", 0)
        accepted = spec.get("accepted_tokens", 0)
        guessing = spec.get("drafts", 0)
        rows.append(f"| {name} | {rate['plain']:.1f} | {rate['ngram']:.1f} | "
                    f"{rate['ngram'] / rate['plain']:.2f}× | "
                    f"{accepted / drafts * 100 if drafts else 0:.0f}% of {int(drafts)} | "
                    f"{copies * 100:.0f}% |")
        # Steps: one per token not gained by a kept guess (less the first, from the prefill).
        decode_steps = tokens - accepted
        per = (lambda x: x / guessing) if guessing else (lambda x: 0)
        steps.append(f"| {name} | {int(tokens)} | {int(decode_steps)} | {int(guessing)} "
                     f"({guessing / decode_steps * 100:.0f}%) | {per(drafts):.2f} | "
                     f"{per(accepted):.2f} |")
    print(f"`--speculative-config '{args.spec}'`, greedy, {TOKENS} tokens a request, one "
          "request at a time; medians over rounds.\n")
    print("| workload | without tok/s | with tok/s | with / without | guesses accepted "
          "| answer copied from the prompt |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nEach prompt (medians over rounds):\n")
    print("| prompt | without tok/s | with tok/s | with / without | guesses accepted "
          "| answer copied from the prompt |")
    print("|---|---|---|---|---|---|")
    for name in WORKLOADS:
        for i, label in enumerate(PROMPT_NAMES[name]):
            side = {s: [json.load(open(p))[name]["prompts"][i]
                        for p in sorted(glob.glob(f"{args.dir}/{s}-*.json"))]
                    for s in ("plain", "ngram")}
            r = {s: statistics.median(e["tokens"] / e["seconds"] for e in v)
                 for s, v in side.items()}
            drafts = sum(e["spec"].get("draft_tokens", 0) for e in side["ngram"])
            kept = sum(e["spec"].get("accepted_tokens", 0) for e in side["ngram"])
            print(f"| {name}: {label} | {r['plain']:.1f} | {r['ngram']:.1f} | "
                  f"{r['ngram'] / r['plain']:.2f}× | "
                  f"{kept / drafts * 100 if drafts else 0:.0f}% of {int(drafts)} | "
                  f"{statistics.mean(e['copied'] for e in side['ngram']) * 100:.0f}% |")
    print("\nWith speculation, over all rounds:\n")
    print("| workload | tokens | steps | steps with guesses | guesses per such step "
          "| kept per such step |")
    print("|---|---|---|---|---|---|")
    print("\n".join(steps))
    if glob.glob(f"{args.dir}/peer-spec-*.json"):
        peer_report(args)


def peer_report(args):
    """llama-server without and with its speculation, beside Tessera's two sides."""
    print(f"\nllama-server, without and with `{args.peer_spec_args}`, in the same rounds "
          "(medians over rounds):\n")
    print("| workload | llama-server without | llama-server with | its with / without "
          "| its guesses accepted | Tessera with / llama-server with |")
    print("|---|---|---|---|---|---|")
    for name in WORKLOADS:
        rate, spec = {}, {}
        for side in ("ngram", "peer-plain", "peer-spec"):
            runs = [json.load(open(p))[name]
                    for p in sorted(glob.glob(f"{args.dir}/{side}-*.json"))]
            rate[side] = statistics.median(r["tokens"] / r["seconds"] for r in runs)
            spec[side] = {k: sum(r["spec"].get(k, 0) for r in runs) for k in runs[0]["spec"]}
        drafts = spec["peer-spec"].get("draft_tokens", 0)
        kept = spec["peer-spec"].get("accepted_tokens", 0)
        print(f"| {name} | {rate['peer-plain']:.1f} | {rate['peer-spec']:.1f} | "
              f"{rate['peer-spec'] / rate['peer-plain']:.2f}× | "
              f"{kept / drafts * 100 if drafts else 0:.0f}% of {int(drafts)} | "
              f"**{rate['ngram'] / rate['peer-spec']:.2f}×** |")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--plain", required=True)
    r.add_argument("--ngram", required=True)
    r.add_argument("--peer-plain")
    r.add_argument("--peer-spec")
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--dir", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--dir", required=True)
    rep.add_argument("--spec", required=True)
    rep.add_argument("--peer-spec-args", default="")
    args = p.parse_args()
    {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
