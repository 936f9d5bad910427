#!/usr/bin/env python3
"""What waits on a spinning NCCL collective when two NCCL ranks share one GPU.

Two ranks as threads of this process on GPU 0, NCCL 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1,
driven through the driver API and NCCL's C API (ctypes; no torch, so the only NCCL in the
process is the one named). Each case runs in a child process with a time limit, since a
deadlocked thread cannot be stopped:

- both ranks all-reduce at once, on streams of their own and on the per-thread stream
  (candle's CUDA device queues on the per-thread stream);
- rank 0 all-reduces, then makes a host call (a module load, a synchronous allocation
  and free, a synchronous copy) while rank 1 waits 2 s before its own all-reduce: the
  call waits for the context to go idle and holds it meanwhile, so rank 1 cannot queue
  its all-reduce either (seen on an H200 with NCCL 2.30.7: each case deadlocks);
- rank 1 makes that call before its all-reduce, after rank 0's has started: the same;
- both ranks meet at a host gate before the all-reduce and again after queueing it, as
  Tessera's NCCL ranks sharing a GPU do, with rank 1 making the call before and rank 0
  after: finishes.

Usage: nccl_context_probe.py LIBNCCL [TEXT]
Runs the cases whose names hold TEXT (all without it), prints one GPU-CHECK line per case
as the check binary does, and exits 1 when a case that should finish did not.
"""

import ctypes
import os
import subprocess
import sys
import threading
import time

CU_STREAM_PER_THREAD = 2
NCCL_FLOAT32 = 7
NCCL_SUM = 0
COUNT = 1 << 20
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry tessera_probe_noop() { ret; }
"""


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def check(what, rc):
    if rc != 0:
        raise RuntimeError(f"{what} returned {rc}")


def run_case(case, libnccl):
    cu = ctypes.CDLL("libcuda.so.1")
    nccl = ctypes.CDLL(libnccl)
    check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    uid = UniqueId()
    check("ncclGetUniqueId", nccl.ncclGetUniqueId(ctypes.byref(uid)))
    nccl.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_void_p]
    gate = threading.Barrier(2)
    timings = {}

    def host_call(kind):
        started = time.monotonic()
        if kind == "module load":
            module = ctypes.c_void_p()
            check("cuModuleLoadData", cu.cuModuleLoadData(ctypes.byref(module), PTX))
            func = ctypes.c_void_p()
            check("cuModuleGetFunction",
                  cu.cuModuleGetFunction(ctypes.byref(func), module, b"tessera_probe_noop"))
        elif kind == "synchronous alloc+free":
            ptr = ctypes.c_uint64()
            check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)))
            check("cuMemFree", cu.cuMemFree_v2(ptr))
        elif kind == "synchronous copy":
            ptr = ctypes.c_uint64()
            check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4096)))
            host = (ctypes.c_char * 4096)()
            check("cuMemcpyHtoD", cu.cuMemcpyHtoD_v2(ptr, host, ctypes.c_size_t(4096)))
        return time.monotonic() - started

    def rank(r):
        check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
        if case["stream"] == "per-thread":
            stream = ctypes.c_void_p(CU_STREAM_PER_THREAD)
        else:
            stream = ctypes.c_void_p()
            check("cuStreamCreate", cu.cuStreamCreate(ctypes.byref(stream), 1))
        buf = ctypes.c_uint64()
        check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(COUNT * 4)))
        comm = ctypes.c_void_p()
        check("ncclCommInitRank", nccl.ncclCommInitRank(ctypes.byref(comm), 2, uid, r))
        # One all-reduce together first: NCCL connects the ranks at the first collective.
        check("ncclAllReduce", nccl.ncclAllReduce(buf.value, buf.value, COUNT, NCCL_FLOAT32,
                                                  NCCL_SUM, comm, stream))
        check("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
        gate.wait()
        call = case.get("call")
        if case["who"] == "rank 0 after its collective":
            if r == 1:
                time.sleep(2)
            check("ncclAllReduce", nccl.ncclAllReduce(buf.value, buf.value, COUNT,
                                                      NCCL_FLOAT32, NCCL_SUM, comm, stream))
            if r == 0:
                timings["call"] = host_call(call)
        elif case["who"] == "both, gated":
            if r == 1:
                time.sleep(1)
                timings["call"] = host_call(call)
            gate.wait()
            check("ncclAllReduce", nccl.ncclAllReduce(buf.value, buf.value, COUNT,
                                                      NCCL_FLOAT32, NCCL_SUM, comm, stream))
            gate.wait()
            if r == 0:
                host_call(call)
        elif case["who"] == "rank 1 before its collective":
            if r == 1:
                time.sleep(1)
                timings["call"] = host_call(call)
            check("ncclAllReduce", nccl.ncclAllReduce(buf.value, buf.value, COUNT,
                                                      NCCL_FLOAT32, NCCL_SUM, comm, stream))
        check("cuStreamSynchronize", cu.cuStreamSynchronize(stream))

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    extra = f"; the host call took {timings['call']:.3f} s" if "call" in timings else ""
    print(f"finished in {took:.2f} s{extra}", flush=True)


CASES = [
    {"name": "2 ranks all-reduce, streams of their own", "stream": "own", "who": None,
     "finish": True},
    {"name": "2 ranks all-reduce, the per-thread stream", "stream": "per-thread", "who": None,
     "finish": True},
] + [
    {"name": f"rank 0: {call} while its all-reduce spins (rank 1 joins 2 s later)",
     "stream": "per-thread", "who": "rank 0 after its collective", "call": call,
     "finish": None}
    for call in ["module load", "synchronous alloc+free", "synchronous copy"]
] + [
    {"name": "rank 1: module load before its all-reduce, rank 0's spinning",
     "stream": "per-thread", "who": "rank 1 before its collective", "call": "module load",
     "finish": None},
] + [
    {"name": f"gates before and after the all-reduce, {call} on both sides of it",
     "stream": "per-thread", "who": "both, gated", "call": call, "finish": True}
    for call in ["module load", "synchronous alloc+free", "synchronous copy"]
]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        case = CASES[int(sys.argv[2])]
        run_case(case, os.environ["TESSERA_PROBE_NCCL"])
        return 0
    libnccl = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    env = dict(os.environ, TESSERA_PROBE_NCCL=libnccl, NCCL_MULTI_RANK_GPU_ENABLE="1")
    failed = False
    for i, case in enumerate(CASES):
        if only not in case["name"]:
            continue
        try:
            done = subprocess.run([sys.executable, __file__, "--case", str(i)], env=env,
                                  capture_output=True, text=True, timeout=12)
            what = (done.stdout.strip().splitlines() or ["no output"])[-1]
            if done.returncode != 0:
                what = f"failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
            finished = done.returncode == 0
        except subprocess.TimeoutExpired:
            what, finished = "did not finish within 12 s (deadlock)", False
        name = f"NCCL probe, 2 ranks on one GPU: {case['name']}"
        bound = "finishes" if case["finish"] else "recorded (a deadlock here is the hazard)"
        print(f"GPU-CHECK | {name} | {what} | {bound}", flush=True)
        if case["finish"] and not finished:
            failed = True
            print(f"GPU-CHECK-FAILED | {name}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
