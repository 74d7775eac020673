// The emulated device's contract between its parts (runtime.h implements it; cublas.h and nccl.h use it).
// Device work is queued on a stream and run later by the device thread, one item at a time, in an order that
// respects each stream's order and the events between streams (a seeded interleaving).
#ifndef LLMC_EMU_CONTRACT_H
#define LLMC_EMU_CONTRACT_H

#include <functional>
#include <cuda_runtime.h>

// One queued piece of work. The device thread calls it; it returns true when the work is done. While it returns
// false (an NCCL call whose MPI requests are still open) the device thread calls it again later, in between
// other streams' work; the stream's later items wait for it. A kernel, a copy or a GEMM returns true at once.
typedef std::function<bool(void)> EmuStep;

typedef enum { EMU_KERNEL, EMU_COPY, EMU_BLAS, EMU_NCCL } EmuKind;

// Queues step on stream (NULL: the legacy default stream). what: a name for the launch log and error messages
// (copied). EMU_NCCL items start in the order they were queued, across all streams and communicators (what
// NCCL_LAUNCH_ORDER_IMPLICIT gives on a GPU).
void emu_enqueue(cudaStream_t stream, EmuKind kind, const char *what, EmuStep step);

// "emulated device: <message>" on stderr and the rank stops (exit code 1): for misuse a GPU would fault on.
[[noreturn]] void emu_fail(const char *fmt, ...);

// 1 if [p, p + bytes) lies inside one live device allocation (cudaMalloc) or pinned host allocation
// (cudaMallocHost): what a GPU could read; 0 otherwise.
int emu_device_range(const void *p, size_t bytes);

#endif
