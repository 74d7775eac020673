// The one device allocator. Every device buffer has a category, so --memory-report can show
// (per rank) what the parameters, gradients, optimizer state, activations, logits, comm
// buffers and workspace cost, now and at their peak. These numbers are what the tests assert.
#ifndef LLMC_ALLOC_H
#define LLMC_ALLOC_H

#include "backend.h"

typedef enum {
    MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER, MEM_ACTIVATIONS, MEM_LOGITS, MEM_COMM, MEM_WORKSPACE, MEM_NCAT
} MemCategory;
static const char *mem_category_names[MEM_NCAT] = {
    "parameters", "gradients", "optimizer", "activations", "logits", "comm", "workspace"
};

typedef struct { void *ptr; size_t bytes; MemCategory cat; int kept; } MemBlock;   // kept: see mem_keep
static MemBlock *mem_blocks = NULL;
static int mem_nblocks = 0, mem_capacity = 0;
static size_t mem_current[MEM_NCAT], mem_peak[MEM_NCAT];
static size_t mem_current_total = 0, mem_peak_total = 0;
static long mem_allocations = 0;   // device allocations made (not planned): a run makes none after its first step

// Planning (--plan, --memory-limit, test_gpt's plan = measurement): the allocator only keeps the books.
// mem_alloc hands out distinct fake addresses; nothing is allocated, and the code that plans writes
// nothing through them. A plan may be for another build's floatX (bf16 from the CPU build): the
// allocating code asks floatx_bytes(), never sizeof(floatX).
static int mem_planning = 0;
static size_t mem_plan_floatx = 0;   // planning: the planned build's bytes per floatX (0: this build's)
static uintptr_t mem_plan_next = 0;
static size_t floatx_bytes(void) { return mem_planning && mem_plan_floatx ? mem_plan_floatx : sizeof(floatX); }

// zero-initialised device memory
static void *mem_alloc(size_t bytes, MemCategory cat) {
    if (bytes == 0) { return NULL; }
    void *p = NULL;
    if (mem_planning) {
        mem_plan_next += 256;
        p = (void *)mem_plan_next;
    } else {
    if (device_setup_done) { fail_after_setup("a device allocation", bytes, mem_category_names[cat]); }
    mem_allocations++;
#ifdef USE_CUDA
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        fail("out of device memory allocating %zu bytes for %s", bytes, mem_category_names[cat]);
    }
    cudaCheck(cudaMemsetAsync(p, 0, bytes, main_stream));   // (ordered before any use: mem_setup_done waits)
#else
    p = calloc(1, bytes);
    if (p == NULL) { fail("out of memory allocating %zu bytes for %s", bytes, mem_category_names[cat]); }
#endif
    }
    if (mem_nblocks == mem_capacity) {
        mem_capacity = mem_capacity ? 2 * mem_capacity : 256;
        mem_blocks = (MemBlock *)realloc_check(mem_blocks, mem_capacity * sizeof(MemBlock));
    }
    mem_blocks[mem_nblocks++] = (MemBlock){p, bytes, cat, 0};
    mem_current[cat] += bytes;
    mem_current_total += bytes;
    if (mem_current[cat] > mem_peak[cat]) { mem_peak[cat] = mem_current[cat]; }
    if (mem_current_total > mem_peak_total) { mem_peak_total = mem_current_total; }
    return p;
}

// An activation or workspace buffer whose contents outlive a step (set once at set-up, read every step): the
// emulated device's poisoning below leaves it as it is.
static void mem_keep(void *p) {
    for (int i = 0; i < mem_nblocks; i++) { if (mem_blocks[i].ptr == p) { mem_blocks[i].kept = 1; } }
}

// The emulated device (make BACKEND=emu) fills every activation and workspace buffer with NaN (0xff bytes) at each
// step's start, on the compute stream: a kernel that reads what this step has not written then gives NaN, which the
// checks see (a GPU keeps the last step's values, which hide such a read). What relies on contents from before the
// step is marked with mem_keep: the RoPE table, MoE's padded-layout offsets. (No other buffer relies on the zeros
// of its allocation or on the last step's values: each is written, or cleared, within the step before it is read.)
static void mem_poison_scratch(void) {
#if defined(USE_CUDA) && !defined(__CUDACC__)
    if (getenv("EMU_NO_POISON")) { return; }
    for (int i = 0; i < mem_nblocks; i++) {
        const MemBlock *b = &mem_blocks[i];
        if ((b->cat == MEM_ACTIVATIONS || b->cat == MEM_WORKSPACE) && !b->kept) {
            cudaCheck(cudaMemsetAsync(b->ptr, 0xff, b->bytes, main_stream));
        }
    }
#endif
}

static void mem_free(void *p) {
    if (p == NULL) { return; }
    for (int i = 0; i < mem_nblocks; i++) {
        if (mem_blocks[i].ptr == p) {
            mem_current[mem_blocks[i].cat] -= mem_blocks[i].bytes;
            mem_current_total -= mem_blocks[i].bytes;
            if (device_setup_done && !mem_planning) { fail_after_setup("a device free", mem_blocks[i].bytes, "mem_free"); }
            mem_blocks[i] = mem_blocks[--mem_nblocks];
            if (mem_planning) { return; }
#ifdef USE_CUDA
            cudaCheck(cudaFree(p));
#else
            free(p);
#endif
            return;
        }
    }
    fail("mem_free of a pointer the allocator does not own");
}

// A plan: the allocator's books are set aside, the planning code allocates into empty ones, and its peaks
// come back; then the books are as they were.
// slots: the model's (micro-batch, chunk) activation slots
typedef struct { size_t peak[MEM_NCAT], peak_total; int slots; } MemPlan;
static size_t mem_saved[2 * MEM_NCAT + 2];
static int mem_saved_nblocks;
static void mem_plan_begin(size_t floatx) {
    for (int c = 0; c < MEM_NCAT; c++) {
        mem_saved[c] = mem_current[c];
        mem_saved[MEM_NCAT + c] = mem_peak[c];
        mem_current[c] = mem_peak[c] = 0;
    }
    mem_saved[2 * MEM_NCAT] = mem_current_total; mem_saved[2 * MEM_NCAT + 1] = mem_peak_total;
    mem_current_total = mem_peak_total = 0;
    mem_saved_nblocks = mem_nblocks;
    mem_planning = 1;
    mem_plan_floatx = floatx;
}
static MemPlan mem_plan_end(void) {
    MemPlan plan;
    plan.slots = 0;
    for (int c = 0; c < MEM_NCAT; c++) {
        plan.peak[c] = mem_peak[c];
        mem_current[c] = mem_saved[c];
        mem_peak[c] = mem_saved[MEM_NCAT + c];
    }
    plan.peak_total = mem_peak_total;
    mem_current_total = mem_saved[2 * MEM_NCAT]; mem_peak_total = mem_saved[2 * MEM_NCAT + 1];
    mem_nblocks = mem_saved_nblocks;   // (the plan's books)
    mem_planning = 0;
    mem_plan_floatx = 0;
    return plan;
}

// The end of set-up: the zeroing memsets done; from here a device allocation or free is a bug (fails).
static void mem_setup_done(void) {
    device_synchronize();
    device_setup_done = 1;
}

static void mem_free_all(void) {   // (the end of a run: set-up's buffers go)
    device_setup_done = 0;
    while (mem_nblocks > 0) { mem_free(mem_blocks[mem_nblocks - 1].ptr); }
}

// Gathers every rank's numbers to rank 0 and prints one row per rank: current/peak per category.
static void mem_report(int rank, int world_size, const char *label) {
    const int n = 2 * MEM_NCAT + 2;
    double mine[2 * MEM_NCAT + 2];
    for (int c = 0; c < MEM_NCAT; c++) { mine[2 * c] = (double)mem_current[c]; mine[2 * c + 1] = (double)mem_peak[c]; }
    mine[2 * MEM_NCAT] = (double)mem_current_total;
    mine[2 * MEM_NCAT + 1] = (double)mem_peak_total;
    double *all = (double *)malloc_check(sizeof(double) * n * world_size);
    MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("memory report (%s): MiB per rank, current / peak\n", label);
        printf("%4s", "rank");
        for (int c = 0; c <= MEM_NCAT; c++) { printf(" | %-19s", c < MEM_NCAT ? mem_category_names[c] : "total"); }
        printf("\n");
        for (int r = 0; r < world_size; r++) {
            printf("%4d", r);
            for (int c = 0; c <= MEM_NCAT; c++) {
                printf(" | %8.2f / %8.2f", all[r * n + 2 * c] / 1048576.0, all[r * n + 2 * c + 1] / 1048576.0);
            }
            printf("\n");
        }
        // machine-readable lines, one per rank and category, for tests: "mem rank cat current peak"
        for (int r = 0; r < world_size; r++) {
            for (int c = 0; c <= MEM_NCAT; c++) {
                printf("mem %d %s %.0f %.0f\n", r, c < MEM_NCAT ? mem_category_names[c] : "total", all[r * n + 2 * c],
                       all[r * n + 2 * c + 1]);
            }
        }
        fflush(stdout);
    }
    free(all);
}

#endif
