#!/usr/bin/env python3
"""Embeddings load for scripts/bench: many short inputs in one /v1/embeddings request.

    bench-embeddings.py request --base-url URL --label NAME --round R --out-dir DIR

sends one warm-up request (inputs of its own), then ONE request whose `input` is a list of
--inputs short sentences (a few words each, made from word lists by a seeded generator, so
round R always sends the same list to every server), timed from the first byte sent to the
last byte of the reply. It checks that the reply holds one vector per input, in order,
all of the same width, and writes DIR/embeddings-NAME-R.json (timing, width, token count)
and DIR/embeddings-NAME-R.f32 (the vectors, little-endian f32, input after input).

    bench-embeddings.py report --out-dir DIR --labels tessera,llama-server

reads those files for every round, and prints the markdown for docs/benchmarks.md:
embeddings/s per round and side, the median of the rounds, the ratio of the first label
to the second, and the mean cosine between the two sides' vectors for the same inputs
(both scaled to unit length first); it also writes DIR/embeddings.json with the summary.

    bench-embeddings.py splice --doc docs/benchmarks.md --out-dir DIR --peer-build B

puts the embeddings row into the summary table of a docs/benchmarks.md that
scripts/bench-report.py has just written (from DIR/embeddings.json when this run measured
it, else the row the previous report had, passed as --previous-doc), the section from
DIR/embeddings.md, and makes the header say which llama.cpp each kind of row was measured
against.

Standard library only; only for servers on this machine (loopback).
"""

import argparse
import array
import http.client
import json
import math
import os
import random
import re
import statistics
import sys
import time
import urllib.parse

SECTION_TITLE = "Embeddings: Tessera against llama-server"
ROW_NAME = "server, 512 embeddings in one request: embeddings/s"

ADJECTIVES = "quiet bright old small green heavy quick cold gentle distant hollow silver".split()
NOUNS = "river garden lamp window baker engine forest letter harbor violin ladder kettle".split()
VERBS = "carries follows paints hides finds repairs watches opens counts lifts answers".split()
OBJECTS = ["the stones", "a map", "the bread", "two keys", "the song", "a candle", "the rope",
           "old coins"]
PLACES = ["at dawn", "in the rain", "near the hill", "after supper", "on Monday", "by the sea",
          "before noon", "in winter"]


def sentences(n, seed):
    """n different short sentences (5 to 8 words), the same for the same seed."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        words = [rng.choice(["The", "A", "My", "Our"]), rng.choice(ADJECTIVES), rng.choice(NOUNS),
                 rng.choice(VERBS), rng.choice(OBJECTS)]
        if rng.random() < 0.5:
            words.append(rng.choice(PLACES))
        sentence = " ".join(words) + "."
        if sentence not in seen:
            seen.add(sentence)
            out.append(sentence)
    return out


def post(base_url, path, body):
    """(seconds from the first byte sent to the reply read, status, reply body)."""
    u = urllib.parse.urlsplit(base_url)
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    start = time.perf_counter()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    seconds = time.perf_counter() - start
    conn.close()
    return seconds, resp.status, payload


def embed(base_url, inputs, model):
    seconds, status, payload = post(
        base_url, "/v1/embeddings", {"model": model, "input": inputs, "encoding_format": "float"})
    if status != 200:
        sys.exit(f"bench-embeddings: {base_url}/v1/embeddings answered {status}: {payload[:500]!r}")
    reply = json.loads(payload)
    data = reply.get("data")
    if not isinstance(data, list) or len(data) != len(inputs):
        sys.exit(f"bench-embeddings: asked for {len(inputs)} vectors, got "
                 f"{len(data) if isinstance(data, list) else 'no list'}")
    data = sorted(data, key=lambda d: d["index"])
    if [d["index"] for d in data] != list(range(len(inputs))):
        sys.exit("bench-embeddings: the reply's indexes are not 0..n-1")
    vectors = [d["embedding"] for d in data]
    widths = {len(v) for v in vectors}
    if len(widths) != 1:
        sys.exit(f"bench-embeddings: vectors of several widths: {sorted(widths)}")
    return seconds, vectors, reply.get("usage", {}), len(payload)


def model_id(base_url):
    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", "/v1/models")
    reply = json.loads(conn.getresponse().read())
    conn.close()
    return reply["data"][0]["id"]


def cmd_request(args):
    model = model_id(args.base_url)
    # The warm-up has inputs of its own, so neither side's prompt cache holds the measured ones.
    embed(args.base_url, sentences(args.warmup, 1_000_000 + args.round), model)
    inputs = sentences(args.inputs, args.round)
    seconds, vectors, usage, reply_bytes = embed(args.base_url, inputs, model)
    stem = os.path.join(args.out_dir, f"embeddings-{args.label}-{args.round}")
    flat = array.array("f", (x for v in vectors for x in v))
    if sys.byteorder != "little":
        flat.byteswap()
    with open(stem + ".f32", "wb") as f:
        flat.tofile(f)
    result = {
        "label": args.label,
        "round": args.round,
        "inputs": len(inputs),
        "width": len(vectors[0]),
        "seconds": seconds,
        "embeddings_per_s": len(inputs) / seconds,
        "prompt_tokens": usage.get("prompt_tokens"),
        "reply_bytes": reply_bytes,
        "first_input": inputs[0],
        "norm_first": math.sqrt(sum(x * x for x in vectors[0])),
    }
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.label} round {args.round}: {len(inputs)} vectors of width {result['width']} in "
          f"{seconds:.2f} s = {result['embeddings_per_s']:.1f} embeddings/s "
          f"({result['prompt_tokens']} prompt tokens)")


def read_vectors(path, width):
    flat = array.array("f")
    with open(path, "rb") as f:
        flat.frombytes(f.read())
    if sys.byteorder != "little":
        flat.byteswap()
    return [flat[i:i + width] for i in range(0, len(flat), width)]


def unit(v):
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


def cmd_report(args):
    labels = args.labels.split(",")
    runs = {label: {} for label in labels}
    for name in sorted(os.listdir(args.out_dir)):
        m = re.fullmatch(r"embeddings-(.+)-(\d+)\.json", name)
        if m and m.group(1) in runs:
            with open(os.path.join(args.out_dir, name)) as f:
                runs[m.group(1)][int(m.group(2))] = json.load(f)
    rounds = sorted(set.intersection(*(set(r) for r in runs.values())))
    if not rounds:
        sys.exit("bench-embeddings: no round measured both servers")
    a, b = labels
    cosines, widths = [], set()
    for r in rounds:
        ra, rb = runs[a][r], runs[b][r]
        widths |= {ra["width"], rb["width"]}
        if ra["width"] != rb["width"] or ra["inputs"] != rb["inputs"]:
            sys.exit(f"bench-embeddings: round {r}: {a} gave {ra['inputs']}×{ra['width']}, "
                     f"{b} gave {rb['inputs']}×{rb['width']}")
        va = read_vectors(os.path.join(args.out_dir, f"embeddings-{a}-{r}.f32"), ra["width"])
        vb = read_vectors(os.path.join(args.out_dir, f"embeddings-{b}-{r}.f32"), rb["width"])
        for x, y in zip(va, vb):
            cosines.append(sum(p * q for p, q in zip(unit(x), unit(y))))
    med = {label: statistics.median(runs[label][r]["embeddings_per_s"] for r in rounds)
           for label in labels}
    ratios = [runs[a][r]["embeddings_per_s"] / runs[b][r]["embeddings_per_s"] for r in rounds]
    summary = {
        "labels": labels,
        "rounds": len(rounds),
        "inputs": runs[a][rounds[0]]["inputs"],
        "width": widths.pop(),
        "embeddings_per_s": med,
        "ratio": med[a] / med[b],
        "round_ratios": ratios,
        "cosine_mean": statistics.fmean(cosines),
        "cosine_min": min(cosines),
        "prompt_tokens": {label: runs[label][rounds[0]]["prompt_tokens"] for label in labels},
        "norms": {label: runs[label][rounds[0]]["norm_first"] for label in labels},
        "example_input": runs[a][rounds[0]]["first_input"],
    }
    with open(os.path.join(args.out_dir, "embeddings.json"), "w") as f:
        json.dump(summary, f, indent=1)

    lines = [
        f"| round | {a} embeddings/s | {b} embeddings/s | {a} / {b} |",
        "| --- | --- | --- | --- |",
    ]
    for r, ratio in zip(rounds, ratios):
        lines.append(f"| {r} | {runs[a][r]['embeddings_per_s']:.1f} ({runs[a][r]['seconds']:.2f} s) | "
                     f"{runs[b][r]['embeddings_per_s']:.1f} ({runs[b][r]['seconds']:.2f} s) | {ratio:.2f}× |")
    lines.append(f"| median | {med[a]:.1f} | {med[b]:.1f} | **{summary['ratio']:.2f}×** |")
    print("\n".join(lines))


def row_of(summary, peer):
    a, b = summary["labels"]
    t, l = summary["embeddings_per_s"][a], summary["embeddings_per_s"][b]
    return f"| {ROW_NAME} | {peer} | {t:.1f} emb/s | {l:.1f} emb/s | {t / l:.2f}× | – | – |"


def cmd_splice(args):
    with open(args.doc, encoding="utf-8") as f:
        doc = f.read()
    previous = ""
    if args.previous_doc and os.path.exists(args.previous_doc):
        with open(args.previous_doc, encoding="utf-8") as f:
            previous = f.read()
    summary_path = os.path.join(args.out_dir, "embeddings.json")
    section_path = os.path.join(args.out_dir, "embeddings.md")
    measured = os.path.exists(summary_path) and os.path.exists(section_path)

    # The row in the summary table: measured now, else the previous report's.
    row = None
    if measured:
        with open(summary_path) as f:
            row = row_of(json.load(f), args.peer)
    else:
        m = re.search(r"^\| " + re.escape(ROW_NAME) + r" \|.*$", previous, flags=re.M)
        row = m.group(0) if m else None
    lines = doc.split("\n")
    lines = [ln for ln in lines if not ln.startswith(f"| {ROW_NAME} |")]
    if row:
        # After the last server row of the table under "## Tessera against llama.cpp".
        table = []
        if "## Tessera against llama.cpp" in lines:
            i = lines.index("## Tessera against llama.cpp")
            while i < len(lines) and not lines[i].startswith("| metric |"):
                i += 1
            while i < len(lines) and lines[i].startswith("|"):
                table.append(i)
                i += 1
        if table:
            servers = [i for i in table if lines[i].startswith("| server,")]
            lines.insert((servers or table)[-1] + 1, row)
        else:
            print("bench-embeddings: no summary table to put the row in", file=sys.stderr)
    # Its line under the table says when it was measured, as the other rows' lines do.
    note = None
    if measured and os.path.exists(os.path.join(args.out_dir, "embeddings.meta")):
        with open(os.path.join(args.out_dir, "embeddings.meta")) as f:
            m = f.read().strip()
        note = f"Embeddings row: {m[0].lower()}{m[1:]} Details in the section below."
    else:
        m = re.search(r"^Embeddings row: .*$", previous, flags=re.M)
        note = m.group(0) if m else None
    lines = [ln for i, ln in enumerate(lines) if not ln.startswith("Embeddings row: ") and not (
        ln == "" and i + 1 < len(lines) and lines[i + 1].startswith("Embeddings row: "))]
    if row and note and "## Tessera against llama.cpp" in lines:
        i = lines.index("## Tessera against llama.cpp") + 1
        while i < len(lines) and not lines[i].startswith("## "):
            i += 1
        while lines[i - 1] == "":
            i -= 1
        lines[i:i] = ["", note]
    doc = "\n".join(lines)

    # The section: measured now, else what the report carried over.
    if measured:
        with open(section_path, encoding="utf-8") as f:
            body = f.read().strip()
        parts = re.split(r"(?m)^(## .+)$", doc)
        head = f"## {SECTION_TITLE}"
        if head in parts:
            i = parts.index(head)
            parts[i + 1] = "\n\n" + body + "\n\n"
        else:
            # Right after the summary section.
            i = parts.index("## Tessera against llama.cpp")
            parts[i + 2:i + 2] = [head, "\n\n" + body + "\n\n"]
        doc = "".join(parts)

    # The header names the llama.cpp of each kind of row.
    doc = re.sub(
        r"Reference: llama\.cpp as vendored in llama-cpp-python (\S+): its own `llama-server` "
        r"for the server rows \(`scripts/build-llama-server`\), the low-level API for the engine "
        r"rows \(`scripts/reference-env llamacpp`\);",
        lambda m: (
            "Reference: llama.cpp. Server rows: its own `llama-server` from "
            "`scripts/build-llama-server`, now llama.cpp build " + args.peer_build
            + "; the line under each server table names the build it was measured against (a line "
            "naming none: the llama.cpp vendored in llama-cpp-python 0.3.36). Engine rows: the "
            "low-level API of the llama.cpp vendored in llama-cpp-python " + m.group(1)
            + " (`scripts/reference-env llamacpp`);"),
        doc,
    )
    with open(args.doc, "w", encoding="utf-8") as f:
        f.write(doc if doc.endswith("\n") else doc + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("request")
    r.add_argument("--base-url", required=True)
    r.add_argument("--label", required=True)
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--inputs", type=int, default=512)
    r.add_argument("--warmup", type=int, default=32)
    r.add_argument("--out-dir", required=True)
    p = sub.add_parser("report")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--labels", default="tessera,llama-server")
    s = sub.add_parser("splice")
    s.add_argument("--doc", required=True)
    s.add_argument("--previous-doc")
    s.add_argument("--out-dir", required=True)
    s.add_argument("--peer", default="`llama-server --embedding`")
    s.add_argument("--peer-build", required=True)
    args = ap.parse_args()
    {"request": cmd_request, "report": cmd_report, "splice": cmd_splice}[args.cmd](args)


if __name__ == "__main__":
    main()
