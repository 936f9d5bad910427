// Stands in for CUDA's <cuda_bf16.h> when the kernels are compiled as host C++.
#pragma once
#include "cuda_emulation.h"
