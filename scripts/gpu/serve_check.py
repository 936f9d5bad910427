"""`tessera serve` on CUDA under 16 concurrent streaming clients (for scripts/test-gpu), its
KV cache sized by the default --gpu-memory-utilization:
each request must get the text it gets alone, every stream must end with [DONE], and the
KV blocks in use must return to zero. Only the standard library: the GPU machine has no
network to install a client.

  python3 serve_check.py TESSERA_BINARY MODEL_DIR DEVICES PORT [SERVE_FLAG...]

SERVE_FLAGs go to `tessera serve` (e.g. `--same-gpu-comm nccl`). SERVE_CHECK_BUILD, when
set, names the binary's build in the checks (scripts/test-gpu: the CUDA image's). The texts each prompt got
alone are written to texts-PORT.json, for scripts/gpu/nodes_check.py to compare with.

Prints `GPU-CHECK | ... | ... | ...` lines; exits 1 when a check fails.
"""
import json
import os
import sys
import threading
import time

from client import complete, metric, start_server, stop_server

CLIENTS = 16
MAX_TOKENS = 40


_WORDS = ("Paris Rome Madrid Berlin Vienna London server blocks tensor fox numbers "
          "colours river city capital memory").split()
PROMPTS = [f"The {_WORDS[i]} and the {_WORDS[(i * 7 + 3) % len(_WORDS)]} are" for i in range(CLIENTS)]


def body(prompt, stream, max_tokens=MAX_TOKENS):
    """The request of every check: greedy, EOS ignored."""
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, "ignore_eos": True}


def at_once(client):
    """`client(i)` for every one of the CLIENTS prompts, each on its own thread, all at
    once: their results in prompt order, and the wall time."""
    results = [None] * CLIENTS

    def run(i):
        results[i] = client(i)

    started = time.time()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - started


def check(name, figure, bound, ok):
    print(f"GPU-CHECK | {name} | {figure} | {bound}", flush=True)
    if not ok:
        print(f"GPU-CHECK-FAILED | {name}", flush=True)
    return ok


def main():
    binary, model, devices, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = sys.argv[5:]
    label = " ".join([devices, *extra])
    # Which build of the binary, where it is not scripts/build-gpu's.
    if os.environ.get("SERVE_CHECK_BUILD"):
        label += f" ({os.environ['SERVE_CHECK_BUILD']})"
    ok = True
    proc = None
    try:
        proc = start_server(binary, model, devices, port, f"serve-{port}.log", extra)
        errors = []

        def client(i):
            try:
                return complete(port, body(PROMPTS[i], True))
            except Exception as e:  # noqa: BLE001 - reported as a failed check
                errors.append(f"client {i}: {e}")
                return None

        results, wall = at_once(client)
        alone = [complete(port, body(p, False)) for p in PROMPTS]
        with open(f"texts-{port}.json", "w") as f:
            json.dump([a[0] for a in alone], f)
        same = sum(1 for r, a in zip(results, alone) if r is not None and r[0] == a[0])
        done = sum(1 for r in results if r is not None and r[2])
        ok &= check(f"serve on {label}: {CLIENTS} concurrent streams vs each alone",
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
        ok &= check(f"serve on {label}: KV blocks in use after the clients finished",
                    f"{in_use}", "0", in_use == 0)
    except Exception as e:  # noqa: BLE001
        ok &= check(f"serve on {label}", f"failed: {e}", "runs", False)
    finally:
        if proc is not None:
            code = stop_server(proc)
            ok &= check(f"serve on {label}: exit after SIGTERM", f"{code}", "0", code == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
