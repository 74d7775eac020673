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
// __launch_bounds__(n[, blocks]): one one-byte NOP a warp of n at the kernel's entry (g++'s patchable_function_entry,
// which template kernels keep too); the runtime counts them to refuse a launch of more than n threads a block (n
// rounded up to whole warps), as the CUDA runtime does
#define EMU_LAUNCH_BOUNDS_(n, ...) __attribute__((patchable_function_entry(((n) + 31) / 32, 0)))
#define __launch_bounds__(...) EMU_LAUNCH_BOUNDS_(__VA_ARGS__, 0)
#include "runtime.h"
#include "cublas.h"
#include "cublas_batched.h"
#ifdef USE_NCCL
#include <nccl.h>
#include "nccl.h"
#endif

#endif
