"""Faults at world size 2 over NCCL on the one GPU (for scripts/test-gpu): `tessera serve
--devices cuda:0,cuda:0 --same-gpu-comm nccl` built with the `fault-injection` feature,
rank 1 failing in a step while a stream runs (`--inject-fault 1:KIND:AFTER_STEPS`):

- KIND error: the stream ends with `generation_failed`; the group aborts its NCCL
  communicator and joins a fresh one, the server stays ready, and a request gives the text
  it gave before the fault;
- KIND hang and device: the stream ends with `engine_failed` within --step-timeout (+5 s),
  /readyz answers 503 and the process exits with status 75.

  python3 fault_check.py TESSERA_BINARY MODEL_DIR PORT

TESSERA_CHECK_CPU=1 runs the same checks on two CPU ranks (cpu:0,cpu:1, no NCCL): a dry
run of this script on a machine without a GPU.

Prints `GPU-CHECK | ... | ... | ...` lines; exits 1 when a check fails.
"""
import os
import sys

from client import complete, ready_status, start_server, stop_server, stream_events
from serve_check import PROMPTS, body, check

STEP_TIMEOUT = 10
# Steps before the fault: the warm-up and the first request (16 tokens) run first, then
# the fault lands in the long stream.
AFTER_STEPS = 60


def one(binary, model, port, kind):
    ok = True
    cpu = os.environ.get("TESSERA_CHECK_CPU") == "1"
    devices = "cpu:0,cpu:1" if cpu else "cuda:0,cuda:0"
    extra = ([] if cpu else ["--same-gpu-comm", "nccl"]) + [
        "--step-timeout", str(STEP_TIMEOUT), "--inject-fault", f"1:{kind}:{AFTER_STEPS}"]
    name = f"{'CPU ranks' if cpu else 'NCCL'} world 2, rank 1 fault '{kind}'"
    proc = None
    try:
        proc = start_server(binary, model, devices, port, f"fault-{kind}-{port}.log", extra)
        before = complete(port, body(PROMPTS[1], False, 16))[0]
        text, error, done, seconds = stream_events(port, body(PROMPTS[0], True, 1500))
        code = error and error.get("code")
        if kind == "error":
            after = complete(port, body(PROMPTS[1], False, 16))[0]
            ready = ready_status(port)
            ok &= check(f"{name}: the step fails, a fresh communicator serves on",
                        f"stream error {code!r}, [DONE]: {done}; /readyz {ready}; "
                        f"the next request's text {'equals' if after == before else 'differs from'} "
                        f"the text before the fault",
                        "generation_failed, [DONE]; 200; equal",
                        code == "generation_failed" and done and ready == 200 and after == before)
        else:
            ready = ready_status(port)
            try:
                exit_code = proc.wait(timeout=STEP_TIMEOUT + 30)
            except Exception:  # noqa: BLE001
                exit_code = "still running"
            log = open(f"fault-{kind}-{port}.log").read()
            fired = next((line for line in log.splitlines() if "fault injection: rank 1" in line), "")
            ok &= check(f"{name}: the group fails its requests and exits",
                        f"stream error {code!r} after {seconds:.1f} s of stream, [DONE]: {done}; "
                        f"/readyz {ready}; exit {exit_code}",
                        f"engine_failed, [DONE] within {STEP_TIMEOUT + 15} s; 503 or gone; exit 75",
                        code == "engine_failed" and done and seconds <= STEP_TIMEOUT + 15
                        and ready in (503, None)
                        and exit_code == 75)
            ok &= check(f"{name}: fired", fired[:120] or "no fault-injection line", "fired",
                        bool(fired))
    except Exception as e:  # noqa: BLE001
        ok &= check(name, f"failed: {e}", "runs", False)
    finally:
        if proc is not None and proc.poll() is None:
            stop_server(proc)
    return ok


def main():
    binary, model, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ok = True
    for kind in ("error", "hang", "device"):
        ok &= one(binary, model, port, kind)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
