// The emulated device: the CUDA build's code paths compiled as host code (g++) and run on the CPU (make BACKEND=emu).
// The CUDA toolkit's headers give the types, constants and declarations (cuda_bf16.h's conversions compile on the
// host); these files define what a GPU, its driver and its libraries would do:
//   threads.h   a block's threads as fibers: barriers, shared memory, warp shuffles and votes, atomics, the PTX the
//               flash kernels use (ldmatrix, mma.sync, cp.async)
//   runtime.h   memory, streams and events (deferred, interleaved by a seed), launches, copies
//   cublas.h    cuBLASLt and cuBLAS GEMMs with fp32 accumulation and the output type's rounding
//   nccl.h      NCCL's collectives and point-to-point calls over MPI between the ranks of mpirun
// The model and the kernels do not know which device runs them: a kernel is launched with LAUNCH(...) (which is
// <<<...>>> under nvcc) and declares dynamic shared memory with DYNAMIC_SHARED; nothing else differs.
#ifndef LLMC_EMU_DEVICE_H
#define LLMC_EMU_DEVICE_H

#undef __shared__
#define __shared__ static   // (one block runs at a time, on the one device thread: its statics are the block's)
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
// __launch_bounds__(n[, blocks]): the kernel's code goes into a section named by n (emu_launch_bounds_n), which the runtime reads from the
// executable to refuse a launch of more than n threads a block, as the CUDA runtime does (n must expand to a number)
#define EMU_STRING_(x) #x
#define EMU_STRING(x) EMU_STRING_(x)
#define EMU_LAUNCH_BOUNDS_(n, ...) __attribute__((section("emu_launch_bounds_" EMU_STRING(n))))
#define __launch_bounds__(...) EMU_LAUNCH_BOUNDS_(__VA_ARGS__, 0)
#include "runtime.h"
#include "cublas.h"
#ifdef USE_NCCL
#include <nccl.h>
#include "nccl.h"
#endif

#endif
