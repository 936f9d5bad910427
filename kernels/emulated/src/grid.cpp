// Runs a kernel's grid on the calling CPU thread: every CUDA thread of a block is a fiber
// (ucontext) that runs until it waits at a barrier (__syncthreads, or a warp shuffle),
// and a barrier opens when every thread of its block or warp that has not returned
// waits at it. Blocks run one after another. See include/cuda_emulation.h.

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <vector>

#include "cuda_emulation.h"
#include "grid.h"

namespace emu {

// One launch at a time (`launch_lock`): these, `__shared__` storage and the fibers'
// scheduler are process-wide, and every fiber of a launch runs on the launching thread.
thread_local uint3 thread_idx;
thread_local uint3 block_idx;
uint3 block_dim;
uint3 grid_dim;

namespace {

constexpr int WARP = 32;
constexpr std::size_t STACK_BYTES = 64 * 1024;

enum class Wait { None, Block, Warp, Done };

struct Fiber {
    ucontext_t context;
    std::vector<char> stack;
    uint3 idx;
    Wait wait = Wait::None;
};

struct Launch {
    ucontext_t scheduler;
    std::vector<Fiber> fibers;
    std::vector<std::uint64_t> lanes;  // warp shuffle slots, one per thread
    const std::function<void()>* kernel = nullptr;
    int current = 0;
};

Launch launch;
std::mutex launch_lock;

void wait_at(Wait w) {
    Fiber& f = launch.fibers[launch.current];
    f.wait = w;
    swapcontext(&f.context, &launch.scheduler);
}

void fiber_main() {
    (*launch.kernel)();
    wait_at(Wait::Done);
}

// Opens the barriers every live thread of their block or warp waits at; false when
// none can open (a deadlock: some threads wait where others never arrive).
bool open_barriers() {
    const int n = static_cast<int>(launch.fibers.size());
    bool opened = false;
    for (int w0 = 0; w0 < n; w0 += WARP) {
        const int end = std::min(n, w0 + WARP);
        bool all = true, any = false;
        for (int t = w0; t < end; ++t) {
            const Wait s = launch.fibers[t].wait;
            all &= s == Wait::Warp || s == Wait::Done;
            any |= s == Wait::Warp;
        }
        if (all && any) {
            for (int t = w0; t < end; ++t)
                if (launch.fibers[t].wait == Wait::Warp) launch.fibers[t].wait = Wait::None;
            opened = true;
        }
    }
    if (opened) return true;
    bool all = true, any = false;
    for (const Fiber& f : launch.fibers) {
        all &= f.wait == Wait::Block || f.wait == Wait::Done;
        any |= f.wait == Wait::Block;
    }
    if (all && any) {
        for (Fiber& f : launch.fibers)
            if (f.wait == Wait::Block) f.wait = Wait::None;
        return true;
    }
    return false;
}

void run_block() {
    const int n = static_cast<int>(launch.fibers.size());
    for (Fiber& f : launch.fibers) {
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_main, 0);
        f.wait = Wait::None;
    }
    int done = 0;
    while (done < n) {
        bool ran = false;
        for (int t = 0; t < n; ++t) {
            Fiber& f = launch.fibers[t];
            if (f.wait != Wait::None) continue;
            launch.current = t;
            thread_idx = f.idx;
            swapcontext(&launch.scheduler, &f.context);
            ran = true;
            if (f.wait == Wait::Done) ++done;
        }
        if (!ran && done < n && !open_barriers()) {
            std::fprintf(stderr,
                         "emulated kernel deadlock: block (%u, %u, %u) has threads waiting at "
                         "a barrier that others never reach\n",
                         block_idx.x, block_idx.y, block_idx.z);
            std::abort();
        }
    }
}

}  // namespace

void sync_block() { wait_at(Wait::Block); }

void shuffle_xor(const void* mine, void* theirs, std::size_t bytes, int mask) {
    const int t = launch.current;
    const int n = static_cast<int>(launch.fibers.size());
    std::memcpy(&launch.lanes[t], mine, bytes);
    wait_at(Wait::Warp);
    const int other = (t / WARP) * WARP + ((t % WARP) ^ mask);
    std::memcpy(theirs, other < n ? &launch.lanes[other] : mine, bytes);
    // Nobody overwrites a slot before its warp has read it.
    wait_at(Wait::Warp);
}

void run(uint3 grid, uint3 shape, const std::function<void()>& kernel) {
    std::lock_guard<std::mutex> guard(launch_lock);
    grid_dim = grid;
    block_dim = shape;
    const int n = static_cast<int>(shape.x * shape.y * shape.z);
    launch.kernel = &kernel;
    launch.lanes.assign(n, 0);
    if (static_cast<int>(launch.fibers.size()) != n) launch.fibers = std::vector<Fiber>(n);
    for (int t = 0; t < n; ++t) {
        const unsigned u = static_cast<unsigned>(t);
        launch.fibers[t].idx = {u % shape.x, (u / shape.x) % shape.y, u / (shape.x * shape.y)};
        launch.fibers[t].stack.resize(STACK_BYTES);
    }
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                block_idx = {x, y, z};
                run_block();
            }
}

}  // namespace emu
