// The emulated device's CUDA runtime: memory, streams, events, launches and copies, on the CPU.
//   memory   device memory is host memory (a fresh allocation is filled with 0xff bytes, a NaN in fp32 and bf16,
//            where a GPU gives whatever was there); every allocation is registered, so a GEMM or a collective can
//            check its operands lie inside one.
//   streams  each call queues an item on its stream; one device thread runs the items, one at a time, choosing by
//            a seeded random number among the streams whose next item may run (an event wait may run once the
//            event's record has; an NCCL item may start once every NCCL item queued before it has started). The
//            device thread runs when the host waits on it (a synchronize, a copy to pageable memory), or when the
//            host has queued nothing for EMU_IDLE_MS (the host may be waiting on another rank), so the streams'
//            items accumulate and interleave: a missing cudaStreamWaitEvent changes the results.
//   launches a launch is checked against sm_90's limits (1,024 threads a block, 48 KB of dynamic shared memory
//            unless cudaFuncSetAttribute raised it, 227 KB at most; grid y and z up to 65,535) and fails as the
//            runtime would (cudaGetLastError); its blocks run in a seeded shuffled order (threads.h).
//   copies   an async copy from or to pinned memory (cudaMallocHost) is queued; from pageable memory the source is
//            staged at the call; to pageable memory the call waits for it, as the CUDA runtime does.
// EMU_SEED (default 1) seeds the orders; EMU_LAUNCH_LOG=FILE appends each kernel's name the first time it runs.
// EMU_MUTATE breaks the program on purpose, to show the checks catch it (scripts/test_emu.sh):
//   barrier:KERNEL:N  each thread of KERNEL skips its N-th __syncthreads (a barrier removed from the source)
//   grid:KERNEL       KERNEL's launches run one block short (the last one)
//   block:KERNEL      KERNEL's launches ask for 32 more threads a block (past a __launch_bounds__ it fails)
//   wait:S            the S-th stream the program made (1: main_stream) ignores its cudaStreamWaitEvent calls
//   short:N           the N-th cudaMalloc is 4 bytes short (a kernel reading all of it reads past its end)
// Not modelled: timing (events hold wall-clock times), concurrent kernels, the legacy stream's implicit
// synchronisation with blocking streams (the program makes only non-blocking ones), unified memory, graphs.
#ifndef LLMC_EMU_RUNTIME_H
#define LLMC_EMU_RUNTIME_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <map>
#include <set>
#include <string>
#include <deque>
#include <mutex>
#include <thread>
#include <condition_variable>
#include <tuple>
#include <vector>
#include <algorithm>
#include <type_traits>
#include "contract.h"
#include "threads.h"
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#define EMU_IDLE_MS 20
#define EMU_SM_COUNT 132
#define EMU_SMEM_DEFAULT (48 * 1024)
#define EMU_SMEM_OPTIN (227 * 1024)
#define EMU_GLOBAL_BYTES ((size_t)80 << 30)

void emu_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emulated device: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    fflush(stdout);
    _exit(1);   // (not exit: another thread may hold the runtime's lock or wait on it)
}

// ---- memory ----
typedef struct { size_t bytes; int pinned; } EmuAllocation;
static std::map<uintptr_t, EmuAllocation> emu_allocations;   // by start address
static std::mutex emu_memory_lock;
static size_t emu_device_bytes;

// ---- mutations (EMU_MUTATE) ----
static char emu_mutate_kind[16], emu_mutate_kernel[128];
static long emu_mutate_n;
static void emu_mutate_parse(void) {
    const char *m = getenv("EMU_MUTATE");
    if (m == NULL || !*m) { return; }
    char spec[256];
    snprintf(spec, sizeof(spec), "%s", m);
    char *kind = strtok(spec, ":"), *a = strtok(NULL, ":"), *b = strtok(NULL, ":");
    snprintf(emu_mutate_kind, sizeof(emu_mutate_kind), "%s", kind ? kind : "");
    int named = !strcmp(emu_mutate_kind, "barrier") || !strcmp(emu_mutate_kind, "grid") || !strcmp(emu_mutate_kind, "block");
    if (named && a) { snprintf(emu_mutate_kernel, sizeof(emu_mutate_kernel), "%s", a); }
    emu_mutate_n = strtol(named ? (b ? b : "0") : (a ? a : "0"), NULL, 10);
    if (!strcmp(emu_mutate_kind, "barrier") ? (a == NULL || emu_mutate_n < 1) : named ? a == NULL
        : (strcmp(emu_mutate_kind, "wait") && strcmp(emu_mutate_kind, "short")) || emu_mutate_n < 1) {
        emu_fail("EMU_MUTATE: expected barrier:KERNEL:N, grid:KERNEL, block:KERNEL, wait:S or short:N, got '%s'", m);
    }
}
static int emu_mutation(const char *kind, const char *kernel) {
    static std::once_flag parsed;
    std::call_once(parsed, emu_mutate_parse);
    return !strcmp(emu_mutate_kind, kind) && (kernel == NULL || !strcmp(emu_mutate_kernel, kernel));
}

static const EmuAllocation *emu_find(const void *p, uintptr_t *start) {
    auto it = emu_allocations.upper_bound((uintptr_t)p);
    if (it == emu_allocations.begin()) { return NULL; }
    --it;
    *start = it->first;
    return (uintptr_t)p < it->first + it->second.bytes ? &it->second : NULL;
}
int emu_device_range(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> g(emu_memory_lock);
    uintptr_t start = 0;
    const EmuAllocation *a = emu_find(p, &start);
    return a != NULL && (uintptr_t)p + bytes <= start + a->bytes;
}
static int emu_is_pinned(const void *p) {
    std::lock_guard<std::mutex> g(emu_memory_lock);
    uintptr_t start = 0;
    const EmuAllocation *a = emu_find(p, &start);
    return a != NULL && a->pinned;
}
static long emu_device_allocations;
static size_t emu_short_allocation;   // (EMU_MUTATE=short:N: allocation N's size, until its end is poisoned)
static void *emu_short_pointer;
// EMU_MUTATE=short:N, at the first kernel: allocation N's last 4 bytes become unaddressable (AddressSanitizer's
// poisoning; the setup's copies into it are done), as if it were one fp32 element short: a kernel reading all of it
// reads past its end. (Without AddressSanitizer nothing changes.)
static void emu_short_mutation_arm(void) {
#if defined(__SANITIZE_ADDRESS__)
    if (emu_short_pointer != NULL) { __asan_poison_memory_region((char *)emu_short_pointer + emu_short_allocation - 4, 4); }
#endif
    emu_short_pointer = NULL;
}
static void *emu_allocate(size_t bytes, int pinned) {
    if (!pinned && emu_mutation("short", NULL) && ++emu_device_allocations == emu_mutate_n) { emu_short_allocation = bytes; }
    void *p = NULL;   // (the size as asked: AddressSanitizer guards its end)
    if (posix_memalign(&p, 256, bytes > 0 ? bytes : 1) != 0) { return NULL; }
    memset(p, pinned ? 0 : 0xff, bytes);
    if (emu_short_allocation == bytes && emu_short_pointer == NULL && bytes >= 4) { emu_short_pointer = p; }
    std::lock_guard<std::mutex> g(emu_memory_lock);
    emu_allocations[(uintptr_t)p] = (EmuAllocation){bytes, pinned};
    if (!pinned) { emu_device_bytes += bytes; }
    return p;
}
static cudaError_t emu_release(void *p, int pinned) {
    if (p == NULL) { return cudaSuccess; }
    {
        std::lock_guard<std::mutex> g(emu_memory_lock);
        auto it = emu_allocations.find((uintptr_t)p);
        if (it == emu_allocations.end() || it->second.pinned != pinned) { return cudaErrorInvalidValue; }
        if (!pinned) { emu_device_bytes -= it->second.bytes; }
        emu_allocations.erase(it);
    }
    free(p);
    return cudaSuccess;
}

// ---- streams and the device thread ----
typedef enum { ITEM_WORK, ITEM_RECORD, ITEM_WAIT } EmuItemType;
struct CUevent_st {
    uint64_t recorded, completed;   // records queued, records run
    double ms;                      // wall-clock time of the last record run
    int timing;
};
typedef struct {
    EmuItemType type;
    EmuKind kind;
    std::string what;
    EmuStep step;
    cudaEvent_t event;
    uint64_t generation;   // a record: the event's record number; a wait: the record it waits for
    uint64_t nccl_order;   // an NCCL item's place in the issue order
    int started;
} EmuItem;
struct CUstream_st {
    std::deque<EmuItem> items;
    int running;           // its head is being run by the device thread
    int number;            // 1, 2, ... in the order the program made them (0: the legacy stream)
};

static std::mutex emu_lock;
static std::condition_variable emu_changed;
static std::vector<cudaStream_t> emu_streams;     // every stream, the legacy one first
static struct CUstream_st emu_legacy_stream;
static uint64_t emu_nccl_queued, emu_nccl_started;
static int emu_host_waiting;                       // host threads waiting for the device
static size_t emu_pending;                         // items queued, not yet done
static double emu_last_queued_ms;
static std::thread emu_device_thread;
static int emu_started;
static uint64_t emu_seed = 1;
static cudaError_t emu_last_error = cudaSuccess;
static FILE *emu_launch_log;
static std::set<std::string> emu_logged;

static double emu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static cudaStream_t emu_stream(cudaStream_t s) { return s == NULL ? &emu_legacy_stream : s; }

// may the head of s run now?
static int emu_head_ready(cudaStream_t s) {
    if (s->items.empty() || s->running) { return 0; }
    const EmuItem &it = s->items.front();
    if (it.type == ITEM_WAIT) { return it.event->completed >= it.generation; }
    if (it.type == ITEM_WORK && it.kind == EMU_NCCL && !it.started) { return it.nccl_order == emu_nccl_started; }
    return 1;
}

// runs one ready head (chosen by the seed) with the lock released; 0 if none was ready
static int emu_run_one(std::unique_lock<std::mutex> &lk) {
    cudaStream_t ready[64];
    int n = 0;
    for (cudaStream_t s : emu_streams) { if (emu_head_ready(s) && n < 64) { ready[n++] = s; } }
    if (n == 0) { return 0; }
    cudaStream_t s = ready[emu_rand() % (uint32_t)n];
    EmuItem &it = s->items.front();
    int done = 1;
    if (it.type == ITEM_RECORD) {
        it.event->completed = it.generation;
        it.event->ms = emu_now_ms();
    } else if (it.type == ITEM_WORK) {
        if (it.kind == EMU_NCCL && !it.started) { emu_nccl_started++; }
        it.started = 1;
        s->running = 1;
        EmuStep step = it.step;
        lk.unlock();
        done = step();
        lk.lock();
        s->running = 0;
    }
    if (done) { s->items.pop_front(); emu_pending--; }
    emu_changed.notify_all();
    return done;
}

static void emu_device_main(void) {
    emu_threads_setup();
    emu_rng_state = emu_seed * 0x9e3779b97f4a7c15ull + 1;
    std::unique_lock<std::mutex> lk(emu_lock);
    for (;;) {
        while (emu_pending == 0 || (emu_host_waiting == 0 && emu_now_ms() - emu_last_queued_ms < EMU_IDLE_MS)) {
            emu_changed.wait_for(lk, std::chrono::milliseconds(EMU_IDLE_MS / 2));
        }
        if (!emu_run_one(lk)) {   // (every ready head is an NCCL call waiting on other ranks: let them run)
            lk.unlock();
            std::this_thread::yield();
            lk.lock();
        }
    }
}

static void emu_start(void) {
    if (emu_started) { return; }
    emu_started = 1;
    const char *seed = getenv("EMU_SEED");
    if (seed != NULL) { emu_seed = strtoull(seed, NULL, 10); }
    const char *log = getenv("EMU_LAUNCH_LOG");
    if (log != NULL && (emu_launch_log = fopen(log, "a")) == NULL) { emu_fail("EMU_LAUNCH_LOG: cannot open %s", log); }
    emu_streams.push_back(&emu_legacy_stream);
    emu_device_thread = std::thread(emu_device_main);
    emu_device_thread.detach();
}

static void emu_queue(cudaStream_t stream, EmuItem it) {
    std::lock_guard<std::mutex> g(emu_lock);
    emu_start();
    if (it.type == ITEM_WORK && it.kind == EMU_NCCL) { it.nccl_order = emu_nccl_queued++; }
    emu_stream(stream)->items.push_back(it);
    emu_pending++;
    emu_last_queued_ms = emu_now_ms();
    emu_changed.notify_all();
}
void emu_enqueue(cudaStream_t stream, EmuKind kind, const char *what, EmuStep step) {
    EmuItem it = {ITEM_WORK, kind, what, step, NULL, 0, 0, 0};
    emu_queue(stream, it);
}

// the host waits until done() holds, the device running meanwhile
template <typename F>
static void emu_wait_until(F done) {
    std::unique_lock<std::mutex> lk(emu_lock);
    emu_start();
    emu_host_waiting++;
    emu_changed.notify_all();
    while (!done()) { emu_changed.wait(lk); }
    emu_host_waiting--;
}
static void emu_drain(cudaStream_t s) {
    s = emu_stream(s);
    emu_wait_until([s] { return s->items.empty(); });
}

// ---- launches ----
static std::map<const void *, int> emu_smem_limit;   // cudaFuncSetAttribute's MaxDynamicSharedMemorySize

// "name<T>" or "(name<T, U>)" -> "name"
static std::string emu_kernel_name(const char *spelled) {
    std::string s(spelled[0] == '(' ? spelled + 1 : spelled);
    size_t lt = s.find('<');
    if (lt != std::string::npos) { s.resize(lt); }
    while (!s.empty() && s.back() == ' ') { s.pop_back(); }
    return s;
}

// the bound __launch_bounds__(n) wrote at the kernel's entry (device.h): ceil(n / 32) one-byte NOPs (0x90), after
// the endbr64 of a build with control-flow protection; none: the device's limit
static long emu_launch_bound(const void *fn) {
    const unsigned char *code = (const unsigned char *)fn, endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};
    if (memcmp(code, endbr64, 4) == 0) { code += 4; }
    int warps = 0;
    while (warps < EMU_MAX_THREADS / 32 && code[warps] == 0x90) { warps++; }
    return warps == 0 ? EMU_MAX_THREADS : 32L * warps;
}

static cudaError_t emu_check_launch(const void *fn, dim3 grid, dim3 block, size_t smem) {
    size_t threads = (size_t)block.x * block.y * block.z;
    if (threads == 0 || threads > EMU_MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64) { return cudaErrorInvalidConfiguration; }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) { return cudaErrorInvalidConfiguration; }
    std::lock_guard<std::mutex> g(emu_lock);
    auto it = emu_smem_limit.find(fn);
    size_t limit = it == emu_smem_limit.end() ? EMU_SMEM_DEFAULT : (size_t)it->second;
    if (smem > limit) { return cudaErrorInvalidValue; }
    if ((long)threads > emu_launch_bound(fn)) { return cudaErrorLaunchOutOfResources; }   // (as the runtime says it)
    return cudaSuccess;
}

// every block of a launch, in a seeded order (on the device thread)
EMU_UNCHECKED static void emu_run_grid(const char *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void(void)> *body) {
    size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<size_t> order(nblocks);
    for (size_t i = 0; i < nblocks; i++) { order[i] = i; }
    for (size_t i = nblocks; i > 1; i--) { size_t j = emu_rand() % i, t = order[i - 1]; order[i - 1] = order[j]; order[j] = t; }
    std::vector<unsigned char> shared(smem + 16);
    EmuBlock *b = emu_block;
    b->kernel = kernel; b->bdim = block; b->gdim = grid; b->body = body;
    b->skip_barrier = emu_mutation("barrier", kernel) ? (unsigned)emu_mutate_n : 0;
    if (emu_mutation("grid", kernel) && nblocks > 1) { nblocks--; order.erase(std::find(order.begin(), order.end(), nblocks)); }
    b->nthreads = (int)(block.x * block.y * block.z);
    b->dynamic_smem = smem ? (unsigned char *)(((uintptr_t)shared.data() + 15) & ~(uintptr_t)15) : NULL;
    for (size_t i = 0; i < nblocks; i++) {
        size_t k = order[i];
        b->bid.x = (unsigned)(k % grid.x); b->bid.y = (unsigned)(k / grid.x % grid.y); b->bid.z = (unsigned)(k / ((size_t)grid.x * grid.y));
        if (smem) { memset(b->dynamic_smem, 0xff, smem); }   // (NaN: a read before a write shows)
        emu_run_block(b->nthreads);
    }
}

static void emu_log_launch(const std::string &name) {
    if (emu_launch_log == NULL || !emu_logged.insert(name).second) { return; }
    fprintf(emu_launch_log, "%s\n", name.c_str());
    fflush(emu_launch_log);
}

// kernel<<<grid, block, smem, stream>>>(args): the arguments converted to the kernel's parameters and copied now,
// the blocks run when the device reaches the item
template <typename... P>
struct EmuLaunch {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    void operator()(P... args) const {   // (the arguments converted as in a call: NULL to a pointer)
        std::string kname = emu_kernel_name(name);
        dim3 g = grid, b = block;
        if (emu_mutation("block", kname.c_str())) { b.x += 32; }
        cudaError_t err = emu_check_launch((const void *)kernel, g, b, smem);
        if (err != cudaSuccess) { emu_last_error = err; return; }
        std::tuple<typename std::decay<P>::type...> params(args...);
        void (*k)(P...) = kernel;
        size_t s = smem;
        emu_enqueue(stream, EMU_KERNEL, kname.c_str(), [k, params, kname, g, b, s]() -> bool {
            std::function<void(void)> body = [&]() { std::apply(k, params); };
            emu_short_mutation_arm();
            emu_log_launch(kname);
            emu_run_grid(kname.c_str(), g, b, s, &body);
            return true;
        });
    }
};
template <typename... P>
static EmuLaunch<P...> emu_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    return EmuLaunch<P...>{kernel, name, grid, block, smem, stream};
}
#define LAUNCH(kernel, grid, block, smem, stream) emu_launch(#kernel, kernel, grid, block, smem, stream)
#define DYNAMIC_SHARED(type, name) type *name = (type *)emu_dynamic_shared()

// ---- the runtime API the program calls ----
extern "C" {
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error (emulated device)";
    }
}
cudaError_t cudaGetLastError(void) { cudaError_t e = emu_last_error; emu_last_error = cudaSuccess; return e; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) { return cudaErrorInvalidDevice; }
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "emulated sm_90 (CPU)");
    p->major = 9; p->minor = 0;
    p->multiProcessorCount = EMU_SM_COUNT;
    p->totalGlobalMem = EMU_GLOBAL_BYTES;
    p->sharedMemPerBlock = EMU_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = EMU_SMEM_OPTIN;
    p->maxThreadsPerBlock = EMU_MAX_THREADS;
    p->warpSize = 32;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    std::lock_guard<std::mutex> g(emu_memory_lock);
    *total_b = EMU_GLOBAL_BYTES;
    *free_b = EMU_GLOBAL_BYTES - emu_device_bytes;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = emu_allocate(bytes, 0);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = emu_allocate(bytes, 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {   // (waits for the device, as cudaFree does)
    emu_wait_until([] { return emu_pending == 0; });
    return emu_release(p, 0);
}
cudaError_t cudaFreeHost(void *p) {
    emu_wait_until([] { return emu_pending == 0; });
    return emu_release(p, 1);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::mutex> g(emu_lock);
    emu_start();
    *s = new CUstream_st();
    (*s)->number = (int)emu_streams.size();
    emu_streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {   // (its queued work still runs first)
    emu_drain(s);
    std::lock_guard<std::mutex> g(emu_lock);
    for (size_t i = 0; i < emu_streams.size(); i++) { if (emu_streams[i] == s) { emu_streams.erase(emu_streams.begin() + i); break; } }
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { emu_drain(s); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { emu_wait_until([] { return emu_pending == 0; }); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    *e = new CUevent_st();
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {   // (a record still queued keeps it: freed lazily is not modelled)
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(emu_lock);
        gen = ++e->recorded;
    }
    EmuItem it = {ITEM_RECORD, EMU_KERNEL, "event record", EmuStep(), e, gen, 0, 0};
    emu_queue(s, it);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    if (emu_mutation("wait", NULL) && s != NULL && s->number == emu_mutate_n) { return cudaSuccess; }
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(emu_lock);
        gen = e->recorded;   // the latest record at the call (none: no wait)
    }
    EmuItem it = {ITEM_WAIT, EMU_KERNEL, "event wait", EmuStep(), e, gen, 0, 0};
    emu_queue(s, it);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::unique_lock<std::mutex> lk(emu_lock);
    uint64_t gen = e->recorded;
    lk.unlock();
    emu_wait_until([e, gen] { return e->completed >= gen; });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::mutex> g(emu_lock);
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::mutex> g(emu_lock);
    if (!start->timing || !end->timing) { return cudaErrorInvalidResourceHandle; }
    if (start->completed < start->recorded || end->completed < end->recorded || start->completed == 0) { return cudaErrorNotReady; }
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) { return cudaSuccess; }
    if (value < 0 || value > EMU_SMEM_OPTIN) { return cudaErrorInvalidValue; }
    std::lock_guard<std::mutex> g(emu_lock);
    emu_smem_limit[fn] = value;
    return cudaSuccess;
}

}
template <typename... P>   // (the runtime's C++ overload: a kernel's own pointer)
static cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)fn, attr, value);
}
extern "C" {

// the extent of one side of a copy, checked where it is device memory
static void emu_check_copy_side(const void *p, size_t bytes, int device, const char *side) {
    if (device && bytes > 0 && !emu_device_range(p, bytes)) {
        emu_fail("cudaMemcpy: the %s (%p, %zu bytes) is not inside one device allocation", side, p, bytes);
    }
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) { dst_dev = emu_device_range(dst, bytes); src_dev = emu_device_range(src, bytes); }
    emu_check_copy_side(dst, bytes, dst_dev, "destination");
    emu_check_copy_side(src, bytes, src_dev, "source");
    if (!src_dev && !emu_is_pinned(src)) {   // pageable source: staged before the call returns
        std::shared_ptr<std::vector<char>> staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        emu_enqueue(s, EMU_COPY, "copy", [dst, staged]() -> bool { memcpy(dst, staged->data(), staged->size()); return true; });
    } else {
        emu_enqueue(s, EMU_COPY, "copy", [dst, src, bytes]() -> bool { memmove(dst, src, bytes); return true; });
    }
    if (!dst_dev && !emu_is_pinned(dst)) { emu_drain(s); }   // pageable destination: the call returns once it landed
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, NULL);
    emu_drain(NULL);
    return e;
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    emu_check_copy_side(dst, bytes, 1, "memset's destination");
    emu_enqueue(s, EMU_COPY, "memset", [dst, value, bytes]() -> bool { memset(dst, value, bytes); return true; });
    return cudaSuccess;
}
}

#endif
