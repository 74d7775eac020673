// The test hooks: every place where a test reaches into the program, listed here with its meaning.
//   TRAIN_GPT_SLOW_CHECKPOINT=SECONDS   the checkpoint writer takes that long more between the model file and
//                                       the state file, progressing (a slow disk: kills during a write,
//                                       asynchronous writes, a write longer than --timeout that must not stop the run)
//   TRAIN_GPT_HUNG_CHECKPOINT=SECONDS   the same wait without progress (a hung disk: the run must stop)
//   TRAIN_GPT_STALL=WHERE:RANK          that rank sleeps for good at WHERE: init (before MPI_Init), end (before
//                                       MPI_Finalize): the others must not wait forever
//   TRAIN_GPT_INJECT_NAN=STEP:COUNT     rank 0 makes one gradient element NaN at steps STEP .. STEP+COUNT-1: the
//                                       update must be skipped, and COUNT > --max-skips must stop the run
//   TRAIN_GPT_REVERSE_SENDS=1           the CPU build starts each exchange's point-to-point sends in reverse
//                                       order (comm_p2p): a schedule's order made wrong, which the matrix must catch
//   TRAIN_GPT_COUNTED_DISPATCH=1        MoE layers with a capacity dispatch as dropless ones do (counts exchanged
//                                       over ep) instead of padded: both dispatches must compute the same; the
//                                       bench compares their bytes and time
//   TRAIN_GPT_ALLOC_AT_STEP=STEP        the run allocates a device buffer at that step: the allocator must stop
//                                       it (nothing is allocated after set-up, alloc.h)
//   TRAIN_GPT_RANKS_PER_NODE=N          the grid takes nodes of N consecutive ranks (comm.h's warning for a tp or
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

// Rank `rank` (-1: the launcher's, before MPI_Init) stalls for good at `where`, if told to.
static void test_hook_stall(const char *where, int rank) {
    const char *e = getenv("TRAIN_GPT_STALL"), *r = getenv("OMPI_COMM_WORLD_RANK");
    if (rank < 0) { rank = r ? atoi(r) : 0; }
    char w[16];
    int at;
    if (e && sscanf(e, "%15[a-z]:%d", w, &at) == 2 && !strcmp(w, where) && at == rank) {
        for (;;) { pause(); }
    }
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
