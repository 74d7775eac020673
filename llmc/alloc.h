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

typedef struct { void *ptr; size_t bytes; MemCategory cat; } MemBlock;
static MemBlock *mem_blocks = NULL;
static int mem_nblocks = 0, mem_capacity = 0;
static size_t mem_current[MEM_NCAT], mem_peak[MEM_NCAT];
static size_t mem_current_total = 0, mem_peak_total = 0;

// zero-initialised device memory
static void *mem_alloc(size_t bytes, MemCategory cat) {
    if (bytes == 0) { return NULL; }
    void *p = NULL;
#ifdef USE_CUDA
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) { fail("out of device memory allocating %zu bytes for %s", bytes, mem_category_names[cat]); }
    cudaCheck(cudaMemset(p, 0, bytes));
#else
    p = calloc(1, bytes);
    if (p == NULL) { fail("out of memory allocating %zu bytes for %s", bytes, mem_category_names[cat]); }
#endif
    if (mem_nblocks == mem_capacity) {
        mem_capacity = mem_capacity ? 2 * mem_capacity : 256;
        mem_blocks = (MemBlock *)realloc(mem_blocks, mem_capacity * sizeof(MemBlock));
    }
    mem_blocks[mem_nblocks++] = (MemBlock){p, bytes, cat};
    mem_current[cat] += bytes;
    mem_current_total += bytes;
    if (mem_current[cat] > mem_peak[cat]) { mem_peak[cat] = mem_current[cat]; }
    if (mem_current_total > mem_peak_total) { mem_peak_total = mem_current_total; }
    return p;
}

static void mem_free(void *p) {
    if (p == NULL) { return; }
    for (int i = 0; i < mem_nblocks; i++) {
        if (mem_blocks[i].ptr == p) {
            mem_current[mem_blocks[i].cat] -= mem_blocks[i].bytes;
            mem_current_total -= mem_blocks[i].bytes;
            mem_blocks[i] = mem_blocks[--mem_nblocks];
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

static void mem_free_all(void) {
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
        printf("memory report (%s), MiB current/peak per rank:\n", label);
        printf("%-5s", "rank");
        for (int c = 0; c < MEM_NCAT; c++) { printf(" | %21s", mem_category_names[c]); }
        printf(" | %21s\n", "total");
        for (int r = 0; r < world_size; r++) {
            printf("%-5d", r);
            for (int c = 0; c <= MEM_NCAT; c++) {
                printf(" | %9.3f/%9.3f", all[r * n + 2 * c] / 1048576.0, all[r * n + 2 * c + 1] / 1048576.0);
            }
            printf("\n");
        }
        // machine-readable lines, one per rank and category, for tests: "mem rank cat current peak"
        for (int r = 0; r < world_size; r++) {
            for (int c = 0; c < MEM_NCAT; c++) {
                printf("mem %d %s %.0f %.0f\n", r, mem_category_names[c], all[r * n + 2 * c], all[r * n + 2 * c + 1]);
            }
        }
        fflush(stdout);
    }
    free(all);
}

#endif
