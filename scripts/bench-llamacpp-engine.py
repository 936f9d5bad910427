#!/usr/bin/env python3
"""llama.cpp's engine speed on a GGUF, measured like Tessera's engine bench
(crates/engine/benches/tokens_per_second.rs): prefill of a 512-token prompt, then 128
single-token greedy decodes, through llama-cpp-python's low-level API (no server, no
Python sampling chain).

    python bench-llamacpp-engine.py --model M.gguf --prompt-file P.txt [--threads 2] [--json OUT]

Run with the venv of `scripts/reference-env llamacpp`. Prints one markdown table row and,
with --json, writes {"prefill_tok_s", "prefill_ms", "decode_tok_s", ...} to OUT.

    python bench-llamacpp-engine.py --model M.gguf --print-stop-ids

prints, comma-separated, the token ids that end generation in llama.cpp (its end-of-
generation set) or in Tessera (the usual end-of-turn markers), for logit_bias in
scripts/bench-serve.py.
"""

import argparse
import ctypes
import json
import sys
import time

import llama_cpp as L
import numpy as np


def tokenize(vocab, text):
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, data, len(data), buf, cap, False, False)
    if n < 0:
        raise SystemExit(f"llama_tokenize failed ({n})")
    return list(buf[:n])


class Batch:
    """One llama_batch for sequence 0, reused for every decode call."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.b = L.llama_batch_init(capacity, 0, 1)

    def fill(self, tokens, start_pos, logits_last_only=True):
        assert len(tokens) <= self.capacity
        b = self.b
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 0
        if logits_last_only:
            b.logits[len(tokens) - 1] = 1

    def free(self):
        L.llama_batch_free(self.b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-file")
    ap.add_argument("--print-stop-ids", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="prefill runs; the fastest counts")
    ap.add_argument("--json")
    args = ap.parse_args()

    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda *a: None)  # kept alive while llama.cpp may call it
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    if args.print_stop_ids:
        ids = {t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)}
        for marker in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>"):
            data = marker.encode()
            buf = (L.llama_token * 8)()
            n = L.llama_tokenize(vocab, data, len(data), buf, 8, False, True)
            if n == 1:
                ids.add(buf[0])
        print(",".join(str(t) for t in sorted(ids)))
        L.llama_model_free(model)
        return
    if not args.prompt_file:
        ap.error("--prompt-file is needed")

    n_prompt = args.prompt_tokens
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_prompt + args.decode_tokens + 16
    cparams.n_batch = max(512, n_prompt)
    cparams.n_ubatch = max(512, n_prompt)
    cparams.n_seq_max = 1
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("cannot create the llama.cpp context")
    mem = L.llama_get_memory(ctx)

    text = open(args.prompt_file, encoding="utf-8").read()
    tokens = tokenize(vocab, text)
    if len(tokens) < n_prompt:
        raise SystemExit(f"prompt file has {len(tokens)} tokens, need {n_prompt}")
    prompt = tokens[:n_prompt]

    batch = Batch(max(512, n_prompt))

    def logits_argmax():
        ptr = L.llama_get_logits_ith(ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    def prefill():
        L.llama_memory_clear(mem, True)
        batch.fill(prompt, 0)
        start = time.perf_counter()
        if L.llama_decode(ctx, batch.b) != 0:
            raise SystemExit("llama_decode (prefill) failed")
        tok = logits_argmax()
        return time.perf_counter() - start, tok

    prefill()  # warm-up
    best = min(prefill()[0] for _ in range(args.repeats))

    # Decode: a fresh prefill, then one token at a time, each the greedy pick of the last.
    _, tok = prefill()
    start = time.perf_counter()
    for i in range(args.decode_tokens):
        batch.fill([tok], n_prompt + i)
        if L.llama_decode(ctx, batch.b) != 0:
            raise SystemExit("llama_decode (decode) failed")
        tok = logits_argmax()
    decode_s = time.perf_counter() - start

    res = {
        "prompt_tokens": n_prompt,
        "decode_tokens": args.decode_tokens,
        "threads": args.threads,
        "n_batch": cparams.n_batch,
        "n_ubatch": cparams.n_ubatch,
        "prefill_ms": best * 1e3,
        "prefill_tok_s": n_prompt / best,
        "decode_tok_s": args.decode_tokens / decode_s,
        "llama_cpp_python": L.__version__,
    }
    print(
        f"| llama.cpp (llama-cpp-python {L.__version__}) | {args.threads} | "
        f"{res['prefill_tok_s']:.0f} tok/s ({res['prefill_ms']:.0f} ms) | "
        f"{res['decode_tok_s']:.1f} tok/s |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)

    batch.free()
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    sys.exit(main())
