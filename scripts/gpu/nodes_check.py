"""CUDA ranks across processes (for scripts/test-gpu): two `tessera serve` processes, a
leader and a worker (`--nnodes 2`, each `--devices cuda:0`), on the one GPU, joined by NCCL
through the unique id the leader hands out at rendezvous (NCCL 2.30 with
NCCL_MULTI_RANK_GPU_ENABLE=1 lets the two ranks share the GPU):

- 16 concurrent streaming requests get the texts TP = 2 gives in one process
  (texts-SAME_PORT.json, written by serve_check.py on `cuda:0,cuda:0`), and the time they
  took is recorded: ranks of separate processes are time-sliced on one GPU;
- `kill -9` of the worker while a stream runs: the leader ends the stream with
  `engine_failed` and exits with status 75 within --step-timeout (+5 s).

  python3 nodes_check.py TESSERA_BINARY MODEL_DIR PORT SAME_PORT

TESSERA_CHECK_CPU=1 runs the same checks with a CPU rank in each process (joined over TCP,
not NCCL): a dry run of this script on a machine without a GPU.

Prints `GPU-CHECK | ... | ... | ...` lines; exits 1 when a check fails.
"""
import json
import os
import subprocess
import sys
import time

from client import _start, stream_events
from serve_check import CLIENTS, MAX_TOKENS, PROMPTS, at_once, body, check

STEP_TIMEOUT = 10


def start_group(binary, model, port, master_port):
    """The worker first (it retries the leader), then the leader, ready on /readyz."""
    device = "cpu:0" if os.environ.get("TESSERA_CHECK_CPU") == "1" else "cuda:0"
    common = ["serve", "--model", model, "--devices", device, "--tensor-parallel-size", "2",
              "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master_port),
              "--step-timeout", str(STEP_TIMEOUT)]
    log = open(f"worker-{port}.log", "w")
    worker = subprocess.Popen([binary, *common, "--node-rank", "1"], stdout=log,
                              stderr=subprocess.STDOUT)
    leader = _start([binary, *common, "--node-rank", "0", "--port", str(port),
                     "--served-model-name", "m"], port, f"leader-{port}.log", "/readyz",
                    "tessera leader")
    return leader, worker


def main():
    binary, model, port, same_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    where = "two CPU processes over TCP" if os.environ.get("TESSERA_CHECK_CPU") == "1" \
        else "two processes on one GPU over NCCL"
    ok = True
    leader = worker = None
    try:
        started = time.time()
        leader, worker = start_group(binary, model, port, port + 1000)
        ok &= check(f"{where}: the group starts",
                    f"ready in {time.time() - started:.1f} s", "ready", True)
        try:
            with open(f"texts-{same_port}.json") as f:
                want = json.load(f)
        except OSError:
            want = None
        results, wall = at_once(lambda i: stream_events(port, body(PROMPTS[i], True)))
        errors = [r[1] for r in results if r[1]]
        same = sum(1 for r, w in zip(results, want or []) if r[0] == w)
        ok &= check(f"{where} (TP=2): {CLIENTS} concurrent streams",
                    f"{same}/{CLIENTS} texts equal to TP=2 in one process"
                    f"{'' if want else ' (no texts from the one-process check)'}, "
                    f"{CLIENTS * MAX_TOKENS / wall:.1f} tok/s together; errors: {errors[:2]}",
                    f"{CLIENTS}/{CLIENTS}", want is not None and same == CLIENTS and not errors)
        for i, (r, w) in enumerate(zip(results, want or [])):
            if r[0] != w:
                print(f"  prompt {i}: two processes {r[0]!r} one process {w!r}", flush=True)

        # A long stream, and the worker killed once it has given tokens.
        killed = {}

        def on_token(n):
            if n == 4 and not killed:
                worker.kill()
                killed["at"] = time.time()

        text, error, done, _ = stream_events(port, body(PROMPTS[0], True, 1500), on_token)
        ended = time.time()
        try:
            code = leader.wait(timeout=STEP_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            code = "still running"
        took = ended - killed.get("at", ended)
        ok &= check(f"{where}: kill -9 of the worker mid-stream",
                    f"stream error {error and error.get('code')!r} {took:.1f} s after the kill, "
                    f"[DONE]: {done}; leader exit {code}",
                    f"engine_failed within {STEP_TIMEOUT + 5} s, exit 75",
                    bool(error) and error.get("code") == "engine_failed"
                    and took <= STEP_TIMEOUT + 5 and code == 75)
    except Exception as e:  # noqa: BLE001
        ok &= check(where, f"failed: {e}", "runs", False)
    finally:
        for p in (leader, worker):
            if p is not None and p.poll() is None:
                p.kill()
        for name in (f"leader-{port}.log", f"worker-{port}.log"):
            if os.path.exists(name):
                print(f"  {name}: " + " | ".join(open(name).read().splitlines()[-4:]), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
