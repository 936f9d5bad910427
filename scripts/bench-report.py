#!/usr/bin/env python3
"""Builds docs/benchmarks.md (on stdout) from the section outputs that scripts/bench keeps
in target/bench/: markdown tables, JSON results and one .meta line per section. A section
with no output there (never run in this worktree) is carried over from the previous
docs/benchmarks.md (--previous) when it has one. Standard library only."""

import argparse
import datetime
import json
import os
import platform
import re


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def load(path):
    text = read(path)
    return json.loads(text) if text else None


def machine():
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}"


def level(serve, clients):
    if not serve:
        return None
    for l in serve["levels"]:
        if l["concurrency"] == clients:
            return l
    return None


def fmt(v, unit, digits):
    return "–" if v is None else f"{v:.{digits}f} {unit}".strip()


def headline(d, threads):
    et = load(os.path.join(d, "engine-tessera.json"))
    el = load(os.path.join(d, "engine-llamacpp.json"))
    st = load(os.path.join(d, "serve-tessera.json"))
    sl = load(os.path.join(d, "serve-llama-server.json"))
    if not (et or el or st or sl):
        return None
    et1 = next((r for r in (et or []) if r["tp"] == 1), None)

    def get(obj, key):
        return None if obj is None else obj.get(key)

    t1, l1 = level(st, 1), level(sl, 1)
    t16, l16 = level(st, 16), level(sl, 16)
    t64, l64 = level(st, 64), level(sl, 64)
    # The slots the peer ran with (BENCH_PEER_SLOTS), from the command line kept with it.
    peer_args = (read(os.path.join(d, "serve-llama-server.args")) or "").split()
    slots = peer_args[peer_args.index("-np") + 1] if "-np" in peer_args[:-1] else "16"
    server_peer = f"`llama-server -np {slots}`"
    engine_peer = "llama.cpp (llama-cpp-python API)"
    # (metric, peer, Tessera, peer's value, unit, digits, target ratio, higher is better)
    rows = [
        ("server, 1 client: output tok/s", server_peer, get(t1, "output_tok_s"), get(l1, "output_tok_s"), "tok/s", 1, 1.3, True),
        ("server, 16 clients: aggregate output tok/s", server_peer, get(t16, "output_tok_s"), get(l16, "output_tok_s"), "tok/s", 1, 2.0, True),
        ("server, 16 clients: median TTFT", server_peer, get(t16, "ttft_median_ms"), get(l16, "ttft_median_ms"), "ms", 0, 0.25, False),
        ("server, 64 clients: aggregate output tok/s", server_peer, get(t64, "output_tok_s"), get(l64, "output_tok_s"), "tok/s", 1, None, True),
        ("server, 64 clients: p99 TTFT", server_peer, get(t64, "ttft_p99_ms"), get(l64, "ttft_p99_ms"), "ms", 0, 1.0, False),
        ("prefill, 512-token prompt (engine)", engine_peer, get(et1, "prefill_tok_s"), get(el, "prefill_tok_s"), "tok/s", 0, 1.0, True),
        ("decode, 128 tokens (engine)", engine_peer, get(et1, "decode_tok_s"), get(el, "decode_tok_s"), "tok/s", 1, None, True),
    ]
    out = [
        "| metric | peer | Tessera | peer's | Tessera / peer | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, peer, t, l, unit, digits, target, higher in rows:
        ratio = t / l if (t is not None and l) else None
        if target is None:
            tgt, met = "–", "–"
        else:
            tgt = f"≥ {target:g}×" if higher else f"≤ {target:g}×"
            if ratio is None:
                met = "–"
            else:
                met = "yes" if (ratio >= target if higher else ratio <= target) else "**no**"
        out.append(
            f"| {name} | {peer} | {fmt(t, unit, digits)} | {fmt(l, unit, digits)} | "
            f"{'–' if ratio is None else f'{ratio:.2f}×'} | {tgt} | {met} |"
        )
    return "\n".join(out)


def serve_section(d, max_tokens, threads):
    st = load(os.path.join(d, "serve-tessera.json"))
    sl = load(os.path.join(d, "serve-llama-server.json"))
    if not (st or sl):
        return None
    any_run = st or sl
    lv = any_run["levels"]
    max_tokens = any_run["max_tokens"]
    prompt_tokens = next((l["prompt_tokens_mean"] for l in (st or {}).get("levels", []) if l["prompt_tokens_mean"]), None)
    if prompt_tokens is None:
        prompt_tokens = (st or sl)["check"].get("prompt_tokens")
    reqs = ", ".join(f"{l['requests']} at {l['concurrency']}" for l in lv)
    parts = [
        "`scripts/bench-serve.py` (Python asyncio + aiohttp, like `vllm bench serve` with "
        "`--max-concurrency`): each of C clients sends streaming `/v1/completions` requests one after "
        f"another; requests per level: {reqs} clients. Each request has its own prompt of "
        f"~{prompt_tokens:.0f} tokens, greedy sampling and `max_tokens` {max_tokens}; "
        + (
            "`logit_bias` -100 on the end-of-generation tokens "
            f"({', '.join(map(str, any_run['no_stop_ids']))}), so every request streams exactly "
            f"{max_tokens} tokens (`short` counts those that did not). "
            if any_run.get("no_stop_ids")
            else "no `logit_bias`: the prompts are prose the model continues past "
            f"{max_tokens} tokens, and `short` counts any request that ended sooner. "
        )
        + "Output tok/s is all output "
        "tokens over the wall time of the level; ITL is the mean gap between streamed chunks; "
        "E2E is request latency. Both servers warmed up first, run one at a time.",
        "The peer is llama.cpp's own server, `llama-server`, built from the llama.cpp vendored in "
        "the same llama-cpp-python sdist (`scripts/build-llama-server`, release, native CPU "
        f"flags) and run with 16 parallel slots and continuous batching, {threads} threads: at 64 "
        "clients 48 requests wait for a slot, as they wait for KV room in Tessera.",
    ]
    for label, res, extra in (
        ("Tessera", st, "`tessera serve --model MODEL.gguf --port PORT` (release build, default flags)"),
        ("llama-server", sl, "`" + (read(os.path.join(d, "serve-llama-server.args")) or "llama-server") + "`"),
    ):
        if not res:
            continue
        chk = res["check"]
        parts.append(
            f"**{label}**: {extra}. Check request: {chk['completion_tokens']} of {max_tokens} tokens, "
            f"finish_reason `{chk['finish_reason']}`."
        )
        parts.append(read(os.path.join(d, "serve-tessera.md" if label == "Tessera" else "serve-llama-server.md")))
    return "\n\n".join(p for p in parts if p)


def structured_section(d):
    res = load(os.path.join(d, "structured.json"))
    table = read(os.path.join(d, "structured.md"))
    if not (res and table):
        return None
    load_line = ""
    loads = (read(os.path.join(d, "structured.load")) or "").split()
    if len(loads) == 3:
        # The run itself keeps every core busy, so the load after it says little; other
        # work shows as a load well above the cores before it starts.
        busy = float(loads[0]) > 1.25 * float(loads[2])
        load_line = (
            f" 1-minute load average {loads[0]} before the run and {loads[1]} after it (the "
            f"run itself keeps the cores busy), on {loads[2]} cores"
            + (": **a busy machine** (other work shared the cores), so the absolute tok/s are "
               "low and noisy; the ratio is the figure to read." if busy else ".")
        )
    chk, chk_c = res["check"], res["constrained_check"]
    parts = [
        f"`scripts/bench-serve.py --structured`: {res['concurrency']} clients stream "
        f"`/v1/completions` (prompts and `max_tokens` {res['max_tokens']} as in the server "
        f"section, greedy), {res['requests_per_level']} requests per level, "
        f"{len(res['rounds'])} rounds; each round runs one level with no constraint and one with "
        "every request under `response_format` `json_schema` "
        "(`scripts/bench-data/structured-schema.json`: a title, a bounded year, 1–3 enum tags "
        "and a summary of at least 400 characters, so a constrained request also runs to "
        "`max_tokens`), alternating which goes first. Same server process, `tessera serve` "
        "with default flags (release build). Engine step, masks and mask time come from "
        "`/metrics` (`tessera_step_duration_seconds`, `tessera_structured_output_mask_seconds`): "
        "the mask time is llguidance computing the allowed-token set plus applying it to the "
        "logits row, per constrained token, on the engine thread after the forward pass."
        + load_line,
        f"Check requests: unconstrained {chk['completion_tokens']} of {res['max_tokens']} tokens "
        f"(`{chk['finish_reason']}`); constrained {chk_c['completion_tokens']} tokens "
        f"(`{chk_c['finish_reason']}`), starting `{chk_c['text_start']}`.",
        table,
    ]
    return "\n\n".join(parts)


STRUCTURED_TITLE = "Structured output: JSON schema against unconstrained, 16 clients"

# Sections of earlier reports that no run makes any more.
RETIRED = {"Server under load: Tessera against llama.cpp"}


def previous_sections(path, notes):
    """{title: body} of the `## ` sections of a previous docs/benchmarks.md, without the
    notes' sections (they are appended fresh), each body starting with when it was
    measured."""
    text = read(path) if path else None
    if not text:
        return {}
    # The notes' sections are appended fresh; every other section is kept, wherever it
    # stands (sections written by hand may follow the notes).
    note_titles = set(re.findall(r"^## (.+)$", notes or "", flags=re.M))
    made = re.search(r"Made by `scripts/bench` on (\S+), commit (\w+)\.", text)
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    out = {}
    for title, body in zip(parts[1::2], parts[2::2]):
        if title.strip() in {t.strip() for t in note_titles}:
            continue
        body = body.strip()
        if not body.startswith("Measured on") and made:
            body = (
                f"Measured on {made.group(1)}, commit {made.group(2)} "
                "(carried over from the previous docs/benchmarks.md).\n\n" + body
            )
        out[title.strip()] = body
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--notes")
    ap.add_argument("--previous", help="the docs/benchmarks.md being replaced")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = args.dir
    notes = read(args.notes) if args.notes else None
    previous = previous_sections(args.previous, notes)

    # Sections kept from the previous report were measured on the machine its header
    # names; when this run is on another one, the header keeps that name and the
    # sections measured now say where they were measured.
    header_machine, elsewhere = machine(), None
    before = re.search(r"^Machine: (.+?)\. Model:", read(args.previous) or "", flags=re.M)
    if before and before.group(1) != header_machine:
        header_machine, elsewhere = before.group(1), header_machine

    def meta_of(name):
        m = read(os.path.join(d, name + ".meta"))
        if m and elsewhere:
            m += f" On {elsewhere}, not the machine named at the top."
        return m

    el = load(os.path.join(d, "engine-llamacpp.json"))
    llama_version = el["llama_cpp_python"] if el else "0.3.36"
    out = [
        "# Benchmarks",
        "",
        f"Made by `scripts/bench`, last run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}. "
        "Each section below says when, at which commit and by which command it was measured.",
        f"Machine: {header_machine}. Model: SmolLM2-135M-Instruct Q4_1 (GGUF, `scripts/fetch-model`). "
        f"Reference: llama.cpp as vendored in llama-cpp-python {llama_version}: its own `llama-server` "
        "for the server rows (`scripts/build-llama-server`), the low-level API for the engine rows "
        f"(`scripts/reference-env llamacpp`); both built with GGML_NATIVE=ON, same GGUF, {args.threads} "
        "threads on both sides.",
    ]
    if os.environ.get("BENCH_NOTE"):
        out += ["", "> " + os.environ["BENCH_NOTE"]]

    def section(title, name, data, intro=None):
        """A section with its measured data, else the previous one, else nothing."""
        if not data:
            if title in previous:
                out.extend(["", f"## {title}", "", previous[title]])
            return
        bodies = [b for b in (intro, data) if b]
        out.extend(["", f"## {title}", ""])
        m = meta_of(name)
        if m:
            out.extend([m, ""])
        out.append("\n\n".join(bodies))

    h = headline(d, args.threads)
    if not h and "Tessera against llama.cpp" in previous:
        # A run of other sections keeps the headline as it was.
        out.extend(["", "## Tessera against llama.cpp", "", previous["Tessera against llama.cpp"]])
    if h:
        metas = [meta_of(n) for n in ("engine", "serve")]
        out.extend(["", "## Tessera against llama.cpp", ""])
        out.append(
            "Server rows: the HTTP servers under load (below), against llama.cpp's own server. "
            "Engine rows: engine only (no HTTP). Targets are for Tessera / peer."
        )
        out.extend(["", h])
        if metas[0] and metas[0] == metas[1]:
            metas = [metas[0]]
            labels = ("All rows",)
        else:
            labels = ("Engine rows", "Server rows")
        for label, m in zip(labels, metas):
            if m:
                out.extend(["", f"{label}: {m[0].lower()}{m[1:]}"])

    # Sections this script does not make (the GPU results, written by hand from
    # scripts/bench-gpu's output) are kept as they were, after the headline.
    own = {
        "Tessera against llama.cpp",
        "Engine: Tessera against llama.cpp",
        "Server under load: Tessera against llama-server",
        "All-reduce between CPU ranks (LocalComm)",
        "Engine speed, TP=1 against TP=2 (CPU ranks)",
        "Continuous batching and prefix caching (engine + scheduler, no HTTP)",
        STRUCTURED_TITLE,
    }
    for title, body in previous.items():
        if title not in own and title not in RETIRED:
            out.extend(["", f"## {title}", "", body])

    section("Engine: Tessera against llama.cpp", "engine", read(os.path.join(d, "engine-compare.md")))
    section("Server under load: Tessera against llama-server", "serve", serve_section(d, args.max_tokens, args.threads))
    section(
        "All-reduce between CPU ranks (LocalComm)",
        "allreduce",
        read(os.path.join(d, "allreduce.md")),
        "`cargo bench -p tessera-engine --bench allreduce`",
    )
    section("Engine speed, TP=1 against TP=2 (CPU ranks)", "engine-tp", read(os.path.join(d, "engine-tp.md")))
    section(
        "Continuous batching and prefix caching (engine + scheduler, no HTTP)",
        "batching",
        read(os.path.join(d, "batching.md")),
        "`cargo bench -p tessera-server --bench batching` — greedy, 64-token prompts, 32 output tokens each.",
    )
    section(STRUCTURED_TITLE, "structured", structured_section(d))
    if notes:
        out.extend(["", notes])
    print("\n".join(out))


if __name__ == "__main__":
    main()
