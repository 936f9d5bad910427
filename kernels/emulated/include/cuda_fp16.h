// Stands in for CUDA's <cuda_fp16.h> when the kernels are compiled as host C++.
#pragma once
#include "cuda_emulation.h"
