// The emulated device's threads: a block's threads are fibers on one CPU thread, each running the kernel's own
// body on its own stack; a thread runs until it reaches a barrier (__syncthreads), a warp operation (a shuffle, a
// vote, __syncwarp, ldmatrix, mma) or its end, then the next one runs. When every thread of the block waits at a
// barrier (exited threads count as arrived) they all go on; when every lane of a warp waits at a warp operation,
// that warp's lanes go on. Within each interval between barriers the threads run in a seeded order, and the
// blocks of a launch too, so a race between threads or an order dependence between blocks changes the results
// between two seeds. A barrier no thread can pass (threads of one block waiting at different ones) stops the
// rank, naming the kernel and the block.
// A warp operation is an exchange through memory: each lane writes its value into the warp's slot, waits for the
// warp, reads the slot of the lane it asked for. Two sets of slots alternate, so a lane that goes on to the next
// exchange cannot overwrite a value another lane has yet to read.
// Not modelled: warps running in lock-step (a lane's writes to shared memory are visible to the others only after
// a barrier or a warp operation here too, which is what the CUDA memory model promises), timing, occupancy.
#ifndef LLMC_EMU_THREADS_H
#define LLMC_EMU_THREADS_H

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <vector>
#include <functional>
#include <type_traits>
#include "contract.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

// The emulator's own scheduling is not what AddressSanitizer is here to check (the kernels are): uninstrumented
#if defined(__SANITIZE_ADDRESS__)
#define EMU_UNCHECKED __attribute__((no_sanitize_address))
#else
#define EMU_UNCHECKED
#endif

#define EMU_MAX_THREADS 1024
#if defined(__SANITIZE_ADDRESS__)
#define EMU_STACK_BYTES (256 * 1024)   // (AddressSanitizer's red zones make frames larger)
#else
#define EMU_STACK_BYTES (128 * 1024)
#endif
// Stack i's top sits (17 i mod 1024) cache lines below its end. Stacks EMU_STACK_BYTES apart would otherwise put
// every thread's top in the same set of a 64 KB-periodic L2 (a 1,024-thread block's switches all missing it):
// 64 KB of the stack serves this colouring, the rest the thread.
#define EMU_STACK_COLOR(i) ((size_t)(i) * 17 % 1024 * 64)

typedef enum { FIBER_RUNNING, FIBER_AT_BARRIER, FIBER_AT_WARP_OP, FIBER_DONE } FiberState;

typedef struct { void *dst; const void *src; int bytes; } EmuAsyncCopy;   // a cp.async not yet landed

// One thread of a block
typedef struct EmuThread {
    void *sp;                 // its saved stack pointer while it waits
    void *asan_fake;          // (AddressSanitizer: its fake stack while others run)
    int stack;                // its stack (-1: not started): a thread that ends hands its stack to the next one, so
                              // threads that never wait all run on one stack, warm in the cache
    FiberState state;
    uint3 tid;                // threadIdx
    int linear, lane, warp;   // threadIdx.x + blockDim.x (y + blockDim.y z); lane and warp of the linear index
    unsigned exchanges;       // warp operations so far (which set of slots the next one uses)
    unsigned barriers;        // __syncthreads so far
    std::vector<std::vector<EmuAsyncCopy>> cp_groups;   // committed cp.async groups, oldest first
    std::vector<EmuAsyncCopy> cp_open;                   // issued since the last commit
} EmuThread;

// The block being run (on this CPU thread: the device thread)
typedef struct {
    const char *kernel;
    uint3 bid;
    dim3 bdim, gdim;
    int nthreads;
    unsigned char *dynamic_smem;
    const std::function<void(void)> *body;
    unsigned skip_barrier;    // (a mutation: each thread's barrier number skip_barrier is skipped; 0: none)
    uint64_t exchange[2][EMU_MAX_THREADS];   // each lane's value in a warp exchange (two sets, alternating)
    unsigned exchange_no[2][EMU_MAX_THREADS];  // which of the lane's exchanges put it there
    uint32_t frag[2][EMU_MAX_THREADS][6];    // each lane's registers in an mma (a0..a3, b0, b1)
    const void *rows[2][EMU_MAX_THREADS];    // each lane's row address in an ldmatrix
} EmuBlock;

static EmuThread *emu_self;     // the thread running now (threadIdx and the warp operations read it)
static EmuBlock *emu_block;
static void *emu_scheduler_sp;  // the scheduler's stack pointer while a fiber runs
static EmuThread *emu_threads;  // EMU_MAX_THREADS of them, with their stacks
static unsigned char *emu_stacks;

// ---- the fiber switch: x86-64 System V, callee-saved registers and the FP control words on the old stack ----
// emu_switch(&save, to): pushes rbp rbx r12-r15, stores rsp in *save, loads rsp = to, pops, returns into the other
// fiber (the floating-point control words are not switched: no kernel changes them). A new fiber's stack is made to look as if it had switched away just before its entry.
extern "C" void emu_switch(void **save, void *to);
extern "C" void emu_fiber_entry(void);
__asm__(".text\n"
        ".globl emu_switch\n.type emu_switch,@function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n"
        ".globl emu_fiber_entry\n.type emu_fiber_entry,@function\n"
        "emu_fiber_entry:\n"           // (rbx: the function, r12: its argument, both set by emu_fiber_init)
        "  movq %r12, %rdi\n  callq *%rbx\n  ud2\n"
        ".size emu_fiber_entry, .-emu_fiber_entry\n");

#if defined(__SANITIZE_ADDRESS__)
static const void *emu_scheduler_stack;   // the device thread's own stack
static size_t emu_scheduler_stack_size;
static void *emu_scheduler_fake;            // its fake stack while a fiber runs
#endif
static int emu_free_stacks[EMU_MAX_THREADS], emu_nfree;
static int emu_retired_stack = -1;   // the stack of a thread that has just ended, free once left
static int emu_order[EMU_MAX_THREADS], emu_order_n, emu_order_at;   // this pass's order, the next
static unsigned char *emu_stack_of(const EmuThread *t) { return emu_stacks + (size_t)t->stack * EMU_STACK_BYTES; }
EMU_UNCHECKED static void emu_fiber_init(EmuThread *t);

// Leaves the running context (a thread, or the scheduler starting a pass) for the next thread of this pass, or for
// the scheduler once the pass is done: one switch per wait. save: where the context leaving keeps its stack pointer
// (NULL: a thread that has ended, never resumed).
EMU_UNCHECKED static void emu_run_next(void **save) {
    EmuThread *from = emu_self, *to = NULL;
    void *unused;
    if (emu_order_at < emu_order_n) {
        to = &emu_threads[emu_order[emu_order_at++]];
        if (to->stack < 0) { to->stack = emu_free_stacks[--emu_nfree]; emu_fiber_init(to); }
    }
    emu_self = to;
#if defined(__SANITIZE_ADDRESS__)
    void **fake = save == NULL ? NULL : from ? &from->asan_fake : &emu_scheduler_fake;
    __sanitizer_start_switch_fiber(fake, to ? emu_stack_of(to) : emu_scheduler_stack, to ? EMU_STACK_BYTES : emu_scheduler_stack_size);
#else
    (void)from;
#endif
    emu_switch(save ? save : &unused, to ? to->sp : emu_scheduler_sp);
    // (here again: this context resumed)
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(emu_self ? emu_self->asan_fake : emu_scheduler_fake, NULL, NULL);
#endif
    if (emu_retired_stack >= 0) { emu_free_stacks[emu_nfree++] = emu_retired_stack; emu_retired_stack = -1; }
}

// the running thread stops here until a pass resumes it
EMU_UNCHECKED static void emu_yield(FiberState why) {
    EmuThread *me = emu_self;
    me->state = why;
    emu_run_next(&me->sp);
}

static void emu_fiber_main(EmuThread *t) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    if (emu_retired_stack >= 0) { emu_free_stacks[emu_nfree++] = emu_retired_stack; emu_retired_stack = -1; }
    (*emu_block->body)();
    size_t unwaited = t->cp_open.size();
    for (const std::vector<EmuAsyncCopy> &g : t->cp_groups) { unwaited += g.size(); }
    if (unwaited > 0) {
        emu_fail("kernel %s: thread (%u,%u,%u) of block (%u,%u,%u) ended with cp.async copies it never waited for",
                 emu_block->kernel, t->tid.x, t->tid.y, t->tid.z, emu_block->bid.x, emu_block->bid.y, emu_block->bid.z);
    }
    t->state = FIBER_DONE;
    emu_retired_stack = t->stack;
    emu_run_next(NULL);
}

// a fresh stack whose first switch enters emu_fiber_main(t)
EMU_UNCHECKED static void emu_fiber_init(EmuThread *t) {
    uint64_t *top = (uint64_t *)(emu_stack_of(t) + EMU_STACK_BYTES - EMU_STACK_COLOR(t->stack));   // (16-byte aligned)
    top[-1] = (uint64_t)(uintptr_t)emu_fiber_entry;   // ret lands here with rsp = top: aligned for its call
    top[-2] = 0;                                       // rbp
    top[-3] = (uint64_t)(uintptr_t)emu_fiber_main;     // rbx
    top[-4] = (uint64_t)(uintptr_t)t;                  // r12
    top[-5] = top[-6] = top[-7] = 0;                   // r13 r14 r15
    t->sp = &top[-7];
}

// the stacks, made once by the device thread (the one thread that runs blocks): a page at the bottom of each is a guard (an overflow faults)
static void emu_threads_setup(void) {
    if (emu_threads != NULL) { return; }
    size_t bytes = (size_t)EMU_MAX_THREADS * EMU_STACK_BYTES;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { emu_fail("no memory for %d thread stacks", EMU_MAX_THREADS); }
    emu_stacks = (unsigned char *)m;
#if defined(__SANITIZE_ADDRESS__)
    for (int i = 0; i < EMU_MAX_THREADS; i++) { mprotect(emu_stacks + (size_t)i * EMU_STACK_BYTES, 4096, PROT_NONE); }
#else
    madvise(m, bytes, MADV_HUGEPAGE);   // (the threads' stack tops on few pages: a guard page each would split them)
#endif
    emu_threads = new EmuThread[EMU_MAX_THREADS];
#if defined(__SANITIZE_ADDRESS__)
    pthread_attr_t attr;   // (the device thread's own stack, where each pass ends)
    void *addr;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &addr, &emu_scheduler_stack_size);
    emu_scheduler_stack = addr;
    pthread_attr_destroy(&attr);
#endif
    emu_block = new EmuBlock;
}

// ---- seeded orders ----
static uint64_t emu_rng_state = 1;
EMU_UNCHECKED static uint32_t emu_rand(void) {   // xorshift64*
    emu_rng_state ^= emu_rng_state >> 12; emu_rng_state ^= emu_rng_state << 25; emu_rng_state ^= emu_rng_state >> 27;
    return (uint32_t)((emu_rng_state * 2685821657736338717ull) >> 32);
}
EMU_UNCHECKED static void emu_shuffle(int *a, int n) {
    for (int i = n - 1; i > 0; i--) {   // (j = rand * (i + 1) / 2^32: no division)
        int j = (int)(((uint64_t)emu_rand() * (uint32_t)(i + 1)) >> 32), t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

// Which waiting threads may go on: all of them at a barrier once every live thread is there; a warp's lanes at a
// warp operation once every live lane of that warp is. Returns how many were released.
EMU_UNCHECKED static int emu_release(int n) {
    int live = 0, at_barrier = 0, released = 0;
    for (int i = 0; i < n; i++) {
        live += emu_threads[i].state != FIBER_DONE;
        at_barrier += emu_threads[i].state == FIBER_AT_BARRIER;
    }
    if (live > 0 && at_barrier == live) {
        for (int i = 0; i < n; i++) { if (emu_threads[i].state == FIBER_AT_BARRIER) { emu_threads[i].state = FIBER_RUNNING; released++; } }
        return released;
    }
    for (int w = 0; w < n; w += 32) {
        int lanes = n - w < 32 ? n - w : 32, waiting = 0, alive = 0;
        for (int l = 0; l < lanes; l++) {
            alive += emu_threads[w + l].state != FIBER_DONE;
            waiting += emu_threads[w + l].state == FIBER_AT_WARP_OP;
        }
        if (waiting > 0 && waiting == alive) {
            for (int l = 0; l < lanes; l++) { if (emu_threads[w + l].state == FIBER_AT_WARP_OP) { emu_threads[w + l].state = FIBER_RUNNING; released++; } }
        }
    }
    return released;
}

// Runs one block: every thread's body from its start to its end, cooperatively.
EMU_UNCHECKED static void emu_run_block(int nthreads) {
    EmuBlock *b = emu_block;
    for (int i = 0; i < nthreads; i++) {
        EmuThread *t = &emu_threads[i];
        t->state = FIBER_RUNNING;
        t->linear = i; t->lane = i % 32; t->warp = i / 32;
        t->tid.x = i % b->bdim.x; t->tid.y = (i / b->bdim.x) % b->bdim.y; t->tid.z = i / (b->bdim.x * b->bdim.y);
        t->exchanges = t->barriers = 0;
        emu_block->exchange_no[0][i] = emu_block->exchange_no[1][i] = 0;
        t->cp_groups.clear(); t->cp_open.clear();
        t->stack = -1;
    }
    emu_nfree = 0;
    for (int i = EMU_MAX_THREADS - 1; i >= 0; i--) { emu_free_stacks[emu_nfree++] = i; }
    for (;;) {
        int n = 0;
        for (int i = 0; i < nthreads; i++) { if (emu_threads[i].state == FIBER_RUNNING) { emu_order[n++] = i; } }
        emu_shuffle(emu_order, n);
        emu_order_n = n; emu_order_at = 0;
        if (n > 0) { emu_run_next(&emu_scheduler_sp); }   // (each thread hands over to the next; the last, back here)
        if (emu_release(nthreads) > 0) { continue; }
        int barrier = 0, warp = 0;
        for (int i = 0; i < nthreads; i++) {
            barrier += emu_threads[i].state == FIBER_AT_BARRIER;
            warp += emu_threads[i].state == FIBER_AT_WARP_OP;
        }
        if (barrier + warp == 0) { return; }   // every thread has ended
        emu_fail("kernel %s, block (%u,%u,%u): its threads wait at different barriers (%d at __syncthreads, %d at a "
                 "warp operation whose warp is not all there): a barrier in divergent code",
                 b->kernel, b->bid.x, b->bid.y, b->bid.z, barrier, warp);
    }
}

// ---- what a kernel's body calls ----
#define threadIdx (emu_self->tid)
#define blockIdx (emu_block->bid)
#define blockDim (emu_block->bdim)
#define gridDim (emu_block->gdim)

static inline void __syncthreads(void) {
    if (++emu_self->barriers == emu_block->skip_barrier) { return; }
    emu_yield(FIBER_AT_BARRIER);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; emu_yield(FIBER_AT_WARP_OP); }

// every lane of the warp puts v in; returns the set the warp's values are in once all are there
EMU_UNCHECKED static uint64_t *emu_exchange(uint64_t v) {
    EmuThread *me = emu_self;
    int set = me->exchanges++ & 1;
    emu_block->exchange[set][me->linear] = v;
    emu_block->exchange_no[set][me->linear] = me->exchanges;
    emu_yield(FIBER_AT_WARP_OP);
    return emu_block->exchange[set] + me->warp * 32;
}
// did lane l of this warp take part in this lane's latest exchange (not ended before it, not at another one)?
EMU_UNCHECKED static int emu_lane_took_part(int l) {
    EmuThread *me = emu_self;
    int i = me->warp * 32 + l;
    return i < emu_block->nthreads && emu_block->exchange_no[(me->exchanges - 1) & 1][i] == me->exchanges;
}
template <typename T>
static uint64_t emu_bits(T v) { uint64_t u = 0; memcpy(&u, &v, sizeof(T)); return u; }
template <typename T>
static T emu_from_bits(uint64_t u) { T v; memcpy(&v, &u, sizeof(T)); return v; }
// the value of lane src of this lane's group of `width` lanes (a lane that has ended has no value to give)
template <typename T>
static T emu_shfl(T v, int src, int width) {
    int lane = emu_self->lane, base = lane & ~(width - 1);
    uint64_t *slots = emu_exchange(emu_bits(v));
    int from = base + (src & (width - 1));
    if (!emu_lane_took_part(from)) { emu_fail("kernel %s: a shuffle reads lane %d, which has ended or is elsewhere", emu_block->kernel, from); }
    return emu_from_bits<T>(slots[from]);
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) { (void)mask; return emu_shfl(v, src, width); }
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    (void)mask; return emu_shfl(v, (emu_self->lane & (width - 1)) ^ lane_mask, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    (void)mask;
    int l = emu_self->lane & (width - 1);
    return emu_shfl(v, l + (int)delta < width ? l + (int)delta : l, width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    (void)mask;
    int l = emu_self->lane & (width - 1);
    return emu_shfl(v, l >= (int)delta ? l - (int)delta : l, width);
}
// bit l set where lane l (in mask, not ended) has pred != 0
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    uint64_t *slots = emu_exchange(pred != 0);
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) {
        if (emu_lane_took_part(l) && ((mask >> l) & 1) && slots[l]) { bits |= 1u << l; }
    }
    return bits;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == __ballot_sync(mask, 1); }
static inline unsigned __activemask(void) { return 0xffffffffu; }

// Atomics: the device thread runs one block at a time, so a read-modify-write is atomic as it is.
template <typename T>
static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <typename T>
static inline T atomicMax(T *p, T v) { T old = *p; *p = old > v ? old : v; return old; }
template <typename T>
static inline T atomicMin(T *p, T v) { T old = *p; *p = old < v ? old : v; return old; }
template <typename T>
static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <typename T>
static inline T atomicCAS(T *p, T cmp, T v) { T old = *p; if (old == cmp) { *p = v; } return old; }

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
template <typename T>
static inline T __ldg(const T *p) { return *p; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
float __expf(float x) __THROW { return expf(x); }   // (declared by the toolkit's headers)
float __logf(float x) __THROW { return logf(x); }
template <typename A, typename B>
static inline typename std::common_type<A, B>::type min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B>
static inline typename std::common_type<A, B>::type max(A a, B b) { return a > b ? a : b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
static inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }

// ---- the PTX the flash kernels use (llmc/flash_attention.h), from the PTX ISA's description ----

static float emu_fa_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
static void emu_fa_sync(void) { __syncthreads(); }

static uint32_t emu_bf16_pair(const void *row, int col) {   // two bf16 of a row, the first in the low half
    const uint16_t *r = (const uint16_t *)row;
    return (uint32_t)r[col] | ((uint32_t)r[col + 1] << 16);
}
static uint32_t emu_bf16_column_pair(const void *row0, const void *row1, int col) {
    return (uint32_t)((const uint16_t *)row0)[col] | ((uint32_t)((const uint16_t *)row1)[col] << 16);
}
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l % 8 of matrix l / 8; lane
// (g, t) = (l / 4, l % 4) receives row g, columns 2t, 2t + 1 of each matrix (trans: column g, rows 2t, 2t + 1)
static void emu_fa_ldmatrix(uint32_t r[4], const void *row, int trans) {
    EmuThread *me = emu_self;
    const void **rows = emu_block->rows[me->exchanges++ & 1];
    rows[me->linear] = row;
    emu_yield(FIBER_AT_WARP_OP);
    const void *const *m = rows + me->warp * 32;
    int g = me->lane / 4, t = me->lane % 4;
    for (int j = 0; j < 4; j++) {
        const void *const *mj = m + 8 * j;
        r[j] = trans ? emu_bf16_column_pair(mj[2 * t], mj[2 * t + 1], g) : emu_bf16_pair(mj[g], 2 * t);
    }
}
static float emu_bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
static float emu_bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: the warp's A (16 x 16) and B (16 x 8) rebuilt from every
// lane's registers (a_i at row g (+8 for a1, a3), columns 2t, 2t + 1 (+8 for a2, a3); b_i at rows 2t, 2t + 1
// (+8 for b1), column g); this lane's c = {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]} += (A B), fp32
static void emu_fa_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    EmuThread *me = emu_self;
    uint32_t (*frag)[6] = emu_block->frag[me->exchanges++ & 1];
    memcpy(frag[me->linear], a, 16);
    memcpy(frag[me->linear] + 4, b, 8);
    emu_yield(FIBER_AT_WARP_OP);
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const uint32_t *f = frag[me->warp * 32 + L];
        int gl = L / 4, tl = L % 4;
        for (int i = 0; i < 4; i++) {
            int row = gl + 8 * (i & 1), col = 2 * tl + 8 * (i >> 1);
            A[row][col] = emu_bf16_lo(f[i]); A[row][col + 1] = emu_bf16_hi(f[i]);
        }
        for (int i = 0; i < 2; i++) {
            B[2 * tl + 8 * i][gl] = emu_bf16_lo(f[4 + i]); B[2 * tl + 8 * i + 1][gl] = emu_bf16_hi(f[4 + i]);
        }
    }
    int g = me->lane / 4, t = me->lane % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) { acc += A[row][k] * B[k][col]; }
        c[e] += acc;
    }
}
// cp.async.cg.shared.global (16 bytes, or zeros when bytes is 0): the destination holds NaN until this thread's
// wait retires the copy's group, the latest moment the PTX allows (a read before the wait and a barrier sees NaN)
static void emu_fa_cp_async(void *dst, const void *src, int bytes) {
    uint16_t nan16[8];
    for (int i = 0; i < 8; i++) { nan16[i] = 0x7fc0; }
    memcpy(dst, nan16, 16);
    emu_self->cp_open.push_back((EmuAsyncCopy){dst, src, bytes});
}
static void emu_fa_cp_commit(void) {
    EmuThread *me = emu_self;
    me->cp_groups.push_back(me->cp_open);
    me->cp_open.clear();
}
static void emu_fa_cp_wait(int pending) {
    EmuThread *me = emu_self;
    while ((int)me->cp_groups.size() > pending) {
        for (const EmuAsyncCopy &c : me->cp_groups.front()) {
            if (c.bytes == 16 && !emu_device_range(c.src, 16)) { emu_fail("kernel %s: cp.async reads outside device memory", emu_block->kernel); }
            if (c.bytes == 16) { memcpy(c.dst, c.src, 16); } else { memset(c.dst, 0, 16); }
        }
        me->cp_groups.erase(me->cp_groups.begin());
    }
}
#define FA_HOST_OPS {emu_fa_mma, emu_fa_shfl_xor, emu_fa_sync, emu_fa_ldmatrix, emu_fa_cp_async, emu_fa_cp_commit, emu_fa_cp_wait}

// dynamic shared memory of the block being run (the launch's third parameter)
static inline unsigned char *emu_dynamic_shared(void) { return emu_block->dynamic_smem; }

#endif
