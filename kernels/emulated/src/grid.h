// The grid runner of src/grid.cpp.
#pragma once

#include <functional>

#include "cuda_emulation.h"

namespace emu {
// Runs `kernel` once per thread of every block of `grid`, blocks of `block` threads.
void run(uint3 grid, uint3 block, const std::function<void()>& kernel);
}  // namespace emu
