// The test hooks: every place where a test reaches into the program, listed here with its meaning.
//   TRAIN_GPT_SLOW_CHECKPOINT=SECONDS   the checkpoint writer takes that long more between the model file and
//                                       the state file, progressing (a slow disk: kills during a write,
//                                       asynchronous writes, a write longer than --timeout that must not stop the run)
//   TRAIN_GPT_HUNG_CHECKPOINT=SECONDS   the same wait without progress (a hung disk: the run must stop)
//   TRAIN_GPT_STALL=WHERE:RANK          that rank sleeps for good at WHERE: init (before MPI_Init), end (before
//                                       MPI_Finalize), exchange (in its first point-to-point exchange, its messages
//                                       posted), saying so (and its pid) on stderr: the others must not wait forever
//   TRAIN_GPT_COMM_FAULT=WHAT:GROUP:OP:N:RANK  that rank's collective N of GROUP (its number in the flight recorder),
//                                       an OP (all-reduce, all-gather), goes wrong: skip (not made: the next one
//                                       takes its number), count (made with half its count), swap (an all-reduce:
//                                       made after the rank's next all-reduce on another group): the diagnosis must
//                                       name it (scripts/test_flight.sh)
//   TRAIN_GPT_PP_SCHEDULE=NAME:RANK     that rank runs the pipeline schedule NAME (1f1b, gpipe) whatever the flags
//                                       say: its exchanges no longer pair with its neighbours'
//   TRAIN_GPT_INJECT_NAN=STEP:COUNT     rank 0 makes one gradient element NaN at steps STEP .. STEP+COUNT-1: the
//                                       update must be skipped, and COUNT > --max-skips must stop the run
//   TRAIN_GPT_REVERSE_SENDS=1           the CPU build starts each exchange's point-to-point sends in reverse
//                                       order (comm_p2p): a schedule's order made wrong, which the matrix must catch
//   TRAIN_GPT_COUNTED_DISPATCH=1        MoE layers with a capacity dispatch as dropless ones do (counts exchanged
//                                       over ep) instead of padded: both dispatches must compute the same; the
//                                       bench compares their bytes and time
//   TRAIN_GPT_ALLOC_AT_STEP=STEP        the run allocates a device buffer at that step: the allocator must stop
//                                       it (nothing is allocated after set-up, alloc.h)
//   TRAIN_GPT_RANKS_PER_NODE=N          the grid takes nodes of N consecutive ranks (grid.h's warning for a tp or
//                                       ep group that spans nodes), whatever the ranks share
//   ExpertParallel.route_log            test_gpt reads the routing of each MoE layer (expert_parallel.h)
// Nothing else in the program reads the environment for a test.
#ifndef LLMC_TEST_HOOKS_H
#define LLMC_TEST_HOOKS_H

#include <unistd.h>
#include "utils.h"

// Seconds the checkpoint writer waits before the state file, progressing (hung = 0) or not (0: none).
static double test_hook_slow_checkpoint(int hung) {
    const char *slow = getenv(hung ? "TRAIN_GPT_HUNG_CHECKPOINT" : "TRAIN_GPT_SLOW_CHECKPOINT");
    return slow ? atof(slow) : 0.0;
}

// This rank as the launcher numbers it (0 without one).
static int test_hook_rank(void) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    return r ? atoi(r) : 0;
}

// Rank `rank` (-1: the launcher's, before MPI_Init) stalls for good at `where`, if told to.
static void test_hook_stall(const char *where, int rank) {
    const char *e = getenv("TRAIN_GPT_STALL");
    if (rank < 0) { rank = test_hook_rank(); }
    char w[16];
    int at;
    if (e && sscanf(e, "%15[a-z]:%d", w, &at) == 2 && !strcmp(w, where) && at == rank) {
        fprintf(stderr, "test hook: rank %d (pid %d) stalls at %s\n", rank, (int)getpid(), where);
        fflush(stderr);
        for (;;) { pause(); }
    }
}

// What goes wrong with this rank's collective `seq` of `group`, an `op` (TRAIN_GPT_COMM_FAULT): FAULT_NONE, or once
// FAULT_SKIP, FAULT_COUNT, FAULT_SWAP.
typedef enum { FAULT_NONE, FAULT_SKIP, FAULT_COUNT, FAULT_SWAP } CommFault;
static int test_hook_comm_fault(const char *group, const char *op, unsigned seq) {
    static int fault = -1, rank;
    static char g[16], o[24];
    static unsigned at;
    if (fault < 0) {
        const char *e = getenv("TRAIN_GPT_COMM_FAULT");
        char w[16];
        fault = FAULT_NONE;
        if (e && sscanf(e, "%15[a-z]:%15[a-z]:%23[a-z-]:%u:%d", w, g, o, &at, &rank) == 5) {
            fault = !strcmp(w, "skip") ? FAULT_SKIP : !strcmp(w, "count") ? FAULT_COUNT : !strcmp(w, "swap") ? FAULT_SWAP
                  : FAULT_NONE;
        }
    }
    if (fault == FAULT_NONE || seq != at || strcmp(group, g) != 0 || strcmp(op, o) != 0 || rank != test_hook_rank()) {
        return FAULT_NONE;
    }
    int f = fault;
    fault = FAULT_NONE;   // (once)
    return f;
}

// The pipeline schedule this rank runs instead of the flags' (TRAIN_GPT_PP_SCHEDULE), or NULL.
static const char *test_hook_pp_schedule(void) {
    static char name[16];
    const char *e = getenv("TRAIN_GPT_PP_SCHEDULE");
    int rank;
    if (e && sscanf(e, "%15[a-z0-9]:%d", name, &rank) == 2 && rank == test_hook_rank()) { return name; }
    return NULL;
}

// Whether rank 0 poisons a gradient element at this step.
static int test_hook_inject_nan(int step) {
    static int first = -2, count = 0;
    if (first == -2) {
        const char *e = getenv("TRAIN_GPT_INJECT_NAN");
        first = -1;
        if (e && sscanf(e, "%d:%d", &first, &count) != 2) { first = -1; }
    }
    return first >= 0 && step >= first && step < first + count;
}

// Whether the point-to-point sends of an exchange start in reverse order (a wrong order made on purpose).
static int test_hook_reverse_sends(void) {
    static int reverse = -1;
    if (reverse < 0) { reverse = getenv("TRAIN_GPT_REVERSE_SENDS") != NULL; }
    return reverse;
}

// Whether MoE layers with a capacity use the counted dispatch (expert_parallel.h) instead of the padded one.
static int test_hook_counted_dispatch(void) {
    static int counted = -1;
    if (counted < 0) { counted = getenv("TRAIN_GPT_COUNTED_DISPATCH") != NULL; }
    return counted;
}

// Ranks per node the grid pretends (0: the real nodes).
static int test_hook_ranks_per_node(void) {
    const char *e = getenv("TRAIN_GPT_RANKS_PER_NODE");
    return e ? atoi(e) : 0;
}

// Whether the run allocates a device buffer at this step (which must fail: alloc.h).
static int test_hook_alloc_at_step(int step) {
    const char *e = getenv("TRAIN_GPT_ALLOC_AT_STEP");
    return e && atoi(e) == step;
}

#endif // LLMC_TEST_HOOKS_H
