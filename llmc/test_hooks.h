// The test hooks: every place where a test reaches into the program, listed here with its meaning.
//   TRAIN_GPT_SLOW_CHECKPOINT=SECONDS   the checkpoint writer waits that long between the model file and the
//                                       state file (a slow disk: kills during a write, asynchronous writes)
//   TRAIN_GPT_INJECT_NAN=STEP:COUNT     rank 0 makes one gradient element NaN at steps STEP .. STEP+COUNT-1: the
//                                       update must be skipped, and COUNT > --max-skips must stop the run
//   ExpertParallel.route_log            test_gpt reads the routing of each MoE layer (expert_parallel.h)
// Nothing else in the program reads the environment for a test.
#ifndef LLMC_TEST_HOOKS_H
#define LLMC_TEST_HOOKS_H

#include "utils.h"

// Seconds the checkpoint writer waits before the state file (0: none).
static double test_hook_slow_checkpoint(void) {
    const char *slow = getenv("TRAIN_GPT_SLOW_CHECKPOINT");
    return slow ? atof(slow) : 0.0;
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

#endif // LLMC_TEST_HOOKS_H
