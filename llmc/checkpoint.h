// Checkpoints, layout-independent: a checkpoint written by any layout (tp, sp, pp, dp, ep, ZeRO stage)
// resumes in any other of the same model and global batch, each rank cutting its part out of the
// files as it does from a model file.
//   DIR/model_STEP.bin  the model file (llm.c's format; MoE: ours), rank 0
//   DIR/state_STEP.bin  rank 0: int32 header[256] (below), then the AdamW state of every parameter in
//                       the model file's order: fp32 m, v and (CUDA bf16) the fp32 master weights
//   DIR/DONE_STEP       written once both are complete
// Each file is written under a temporary name (created exclusively, never through a link), fsync'd and
// renamed, and carries the CRC-32 of its header and body in header slot 255; the state file also records
// its model file's CRC and the data's fingerprint. Resume (-y) takes the newest intact checkpoint with a
// DONE_ marker (an unusable newer one is named and passed over). The data position is not stored as such: after
// `step` steps every rank has read step x (accumulation) rounds, and dataloader_seek_rounds finds where
// that leaves it in the resuming layout: exactly where an uninterrupted run of that layout would be (the
// same sequences in the same order without shuffling; with --shuffle 1 the order of rounds depends on
// B and dp, as llm.c's, so another layout continues from the same number of rounds in its own order).
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <pthread.h>
#include "utils.h"
#include "guard.h"
#include "comm.h"
#include "zero.h"
#include "dataloader.h"
#include "rand.h"
#include "model_file.h"
#include "model_units.h"
#include "run_dir.h"
#include "test_hooks.h"

// What a state file holds beside the optimizer state: the step counters, and what a resume must keep
// (every rank passes the same).
typedef struct {
    // AdamW updates applied; updates skipped (a non-finite loss or norm), in all, in a row
    int updates, skips, skips_in_a_row;
    int T, total_batch;                   // the whole sequences' length and the tokens per step: a resume keeps them
    // data-loader rounds per step (the accumulation): the data position is step x rounds
    int rounds;
    int max_steps;                        // the run's -x (the learning-rate schedule's length)
    uint32_t data_fp;                     // dataloader_fingerprint of the training data: a resume keeps it
    int muon;                             // --optimizer muon: the first state holds Muon's momentum for its matrices
} TrainState;

// One full host array (file order) on rank 0 from every rank's units: get(z, u, which, host) gives
// unit u's full contents on every rank of its data-parallel group (a collective over it). The tp-0
// rank of each unit's group rank 0 assembles the unit (the dense units on dp rank 0 of each stage, the
// experts on edp rank 0 of each ep rank); each element is assembled by exactly one rank, so a sum over
// those ranks is the array. Other ranks get NULL.
typedef void (*UnitGetter)(Zero *z, int u, int which, float *host);
static void unit_params_getter(Zero *z, int u, int which, float *host) {
    (void)which;
    zero_get_unit_params(z, u, host);
}

static float *checkpoint_gather(const ModelConfig *c, Zero *z, UnitGetter get, int which) {
    Grid *g = z->grid;
    size_t P = num_parameters(c);
    // (edp rank 0 <=> dp rank < ep)
    int assemble = g->tp_rank == 0 && g->cp_rank == 0 && g->dp_rank < g->ep, root = g->rank == 0;
    float *all = assemble ? (float *)calloc(P, sizeof(float)) : NULL, *full[NUM_TENSORS];
    if (assemble && all == NULL) { fail("out of host memory assembling %zu parameters", P); }
    if (assemble) { split_tensors(c, all, full); }
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        float *host = (float *)malloc_check(U->size * sizeof(float));
        get(z, u, which, host);
        if (U->dpg->rank == 0 && !U->norm_skip) {   // (the last stage's embedding copy: the first's counts)
            float *slices = g->tp_rank == 0 ? (float *)malloc_check(U->size * sizeof(float) * g->tp) : NULL;
            comm_host_gather(&g->tp_group, host, U->size, slices, DT_FLOAT, 0, "gather over tp (checkpoint)");
            if (g->tp_rank == 0) {
                for (int r = 0; r < g->tp; r++) {
                    unit_copy_full(c, U, full, slices + (size_t)r * U->size, g->tp, r, 0);
                }
            }
            free(slices);
        }
        free(host);
    }
    Group assemblers;   // rank 0 first (key: world rank)
    comm_host_group(&assemblers, "assemblers", assemble, g->rank);
    if (assemble) { comm_host_reduce_sum(&assemblers, all, P, DT_FLOAT, 0, "sum of the assembled parts (checkpoint)"); }
    comm_host_group_free(&assemblers);
    if (!root) { free(all); return NULL; }
    return all;
}

// A checkpoint's files, assembled on rank 0 (the header and body of each), written by write_checkpoint:
// at once, or (--async-checkpoint) on a thread of rank 0 while training goes on. DONE_STEP is written
// by the main thread once the files are complete (checkpoint_wait, checkpoint_done_if_finished).
typedef struct {
    char dir[PATH_LEN];
    int step;
    int model_header[256], state_header[256];
    void *model_body;              // the parameters in floatX's file precision
    size_t model_bytes, state_bytes;
    float *states[3];              // m, v, master
    int nstates;
    pthread_t thread;
    int running;                   // a write is in flight (or finished and not yet marked DONE)
    volatile int finished;         // the writer is done (set by it)
    char error[2 * PATH_LEN + 64]; // its failure, if any
} Checkpoint;

static Checkpoint ckpt_writer;   // rank 0's (one write in flight at most)

// Every rank: the full parameters and AdamW state assembled on rank 0 into c (stage 3 and the
// experts gather; each rank contributes its part). Checks that no value is non-finite.
// router_bias: the MoE layers' routing bias (Lm, E) on rank 0 (NULL elsewhere, or without MoE).
static void checkpoint_assemble(const ModelConfig *c, Zero *z, Checkpoint *ck, const char *dir, int step,
                                const TrainState *s, const DataLoader *dl, const Rng *rng, const float *router_bias) {
    Grid *g = z->grid;
    float *all = checkpoint_gather(c, z, unit_params_getter, 0);
    zero_release_params(z);
    int nstates = z->master ? 3 : 2;
    float *states[3] = {NULL, NULL, NULL};
    for (int i = 0; i < nstates; i++) { states[i] = checkpoint_gather(c, z, zero_get_unit_state, i); }
    if (g->rank != 0) { return; }
    check_finite(c, all, "the model");   // never a checkpoint of NaN (the update that would make one is skipped)
    for (int i = 0; i < nstates; i++) { check_finite(c, states[i], "the optimizer state"); }
    memset(ck, 0, sizeof(*ck));
    snprintf(ck->dir, sizeof(ck->dir), "%s", dir);
    ck->step = step;
    size_t P = num_parameters(c);
    int with_bias = model_file_has_bias(c, router_bias);
    model_header_write(ck->model_header, c, sizeof(floatX) == 2, with_bias);
    int *h;
    // the body: the parameters in floatX's precision, then (version 23/25) the routing bias in fp32
    size_t es = sizeof(floatX), nb = with_bias ? num_router_bias(c) : 0;
    char *body = (char *)malloc_check(P * es + nb * sizeof(float));
    if (es == 4) {
        memcpy(body, all, P * sizeof(float));
    } else {
        uint16_t *b = (uint16_t *)body;
        for (size_t i = 0; i < P; i++) { b[i] = float_to_bf16(all[i]); }
    }
    if (nb) { memcpy(body + P * es, router_bias, nb * sizeof(float)); }
    free(all);
    ck->model_body = body; ck->model_bytes = P * es + nb * sizeof(float);
    h = ck->state_header;
    h[0] = STATE_MAGIC; h[1] = STATE_VERSION; h[SH_STEP] = step; h[SH_UPDATES] = s->updates; h[SH_SKIPS] = s->skips;
    h[SH_SKIPS_IN_A_ROW] = s->skips_in_a_row; h[SH_T] = s->T; h[SH_BATCH] = s->total_batch;
    // (rank 0's, for the reader)
    h[SH_EPOCH] = dl->epoch;
    h[SH_SHARD] = dl->shard_pos;
    h[SH_SHUFFLE] = dl->shuffle;
    h[SH_NSHARDS] = dl->nshards;
    h[SH_MASTER] = nstates == 3;
    h[SH_PARAMS_LO] = (int)(P & 0xFFFFFFFFu); h[SH_PARAMS_HI] = (int)((uint64_t)P >> 32);
    h[SH_RNG_LO] = (int)(rng->s & 0xFFFFFFFFu); h[SH_RNG_HI] = (int)(rng->s >> 32);
    h[SH_TP] = g->tp; h[SH_PP] = g->pp; h[SH_DP] = g->dp; h[SH_EP] = g->ep; h[SH_ZERO] = z->stage;   // (for the reader)
    h[SH_MAX_STEPS] = s->max_steps;
    h[SH_OPTIMIZER] = s->muon;   // (0, AdamW: as the files before Muon)
    h[SH_DATA_FP] = (int)s->data_fp;
    h[SH_RUN_LO] = (int)(ckpt_run_id & 0xFFFFFFFFu); h[SH_RUN_HI] = (int)(ckpt_run_id >> 32);
    for (int i = 0; i < nstates; i++) { ck->states[i] = states[i]; }
    ck->nstates = nstates;
    ck->state_bytes = P * sizeof(float);
}

// The test hooks of a slow (progressing) and of a hung disk (test_hooks.h), between the two files.
static void checkpoint_test_delay(void) {
    for (int hung = 0; hung < 2; hung++) {
        double seconds = test_hook_slow_checkpoint(hung);
        for (double t = 0; t < seconds; t += 0.1) { usleep(100 * 1000); if (!hung) { io_progress++; } }
    }
}

// Writes the model and state files of ck (on rank 0's writer thread) and frees its buffers. The state
// records the model file's CRC; a failed state write removes the model file (no orphan).
static void *checkpoint_write(void *arg) {
    Checkpoint *ck = (Checkpoint *)arg;
    char path[PATH_LEN], model[PATH_LEN];
    path_join(model, ck->dir, "model_%08d.bin", ck->step);
    const void *body = ck->model_body;
    int bad = write_file_atomic(model, ck->model_header, &body, &ck->model_bytes, 1, ck->error, sizeof(ck->error));
    checkpoint_test_delay();
    if (!bad) {
        ck->state_header[SH_MODEL_CRC] = ck->model_header[SH_CRC];
        path_join(path, ck->dir, "state_%08d.bin", ck->step);
        const void *parts[3] = {ck->states[0], ck->states[1], ck->states[2]};
        size_t bytes[3] = {ck->state_bytes, ck->state_bytes, ck->state_bytes};
        bad = write_file_atomic(path, ck->state_header, parts, bytes, ck->nstates, ck->error, sizeof(ck->error));
        if (bad) { unlink(model); }
    }
    free(ck->model_body);
    for (int i = 0; i < ck->nstates; i++) { free(ck->states[i]); }
    if (!bad && ckpt_keep_newest > 1) { checkpoint_check_kept(ck->dir, ck->step); }
    ck->finished = 1;
    return NULL;
}

// Rank 0: marks a written checkpoint complete (DONE_STEP), then retention; a failed write stops the run.
static void checkpoint_mark_done(Checkpoint *ck) {
    if (ck->error[0]) { fail("checkpoint of step %d: %s", ck->step, ck->error); }
    char path[PATH_LEN];
    path_join(path, ck->dir, "DONE_%08d", ck->step);
    int fd = create_file(path);
    if (fd < 0 || fsync(fd) != 0 || close(fd) != 0) { fail("cannot write '%s': %s", path, strerror(errno)); }
    sync_dir(ck->dir);
    printf("wrote checkpoint at step %d to %s\n", ck->step, ck->dir);
    checkpoint_info_set(ck->step, 1, 1);
    checkpoint_retain(ck->dir, ck->step);
}

// Rank 0, at a step boundary: if the asynchronous write in flight is complete, marks it DONE.
static void checkpoint_done_if_finished(void) {
    Checkpoint *ck = &ckpt_writer;
    if (!ck->running || !ck->finished) { return; }
    pthread_join(ck->thread, NULL);
    ck->running = 0;
    checkpoint_mark_done(ck);
}

// Every rank, at the same points (before a checkpoint's assembly, after a synchronous one, at a stop, at the
// end): waits with rank 0 until its write in flight, if any, is complete (rank0_wait_done), then rank 0
// marks it DONE.
static void checkpoint_wait(void) {
    Checkpoint *ck = &ckpt_writer;
    int running = comm_world()->rank == 0 && ck->running;
    char what[64] = "the checkpoint write";
    if (running) { snprintf(what, sizeof(what), "the checkpoint write of step %d", ck->step); }
    rank0_wait_done(running ? &ck->finished : NULL, what);
    if (running) { pthread_join(ck->thread, NULL); ck->running = 0; checkpoint_mark_done(ck); }
}

// Every rank: a checkpoint of this step. The assembly is collective and synchronous; rank 0's writer
// thread then writes the files, and every rank waits for it (rank0_wait_done) now, or with async at the
// next checkpoint, a stop or the end, while training goes on.
static void checkpoint_save(const ModelConfig *c, Zero *z, const char *dir, int step, const TrainState *s,
                            const DataLoader *dl, const Rng *rng, int async, const float *router_bias) {
    trace_begin();
    Checkpoint *ck = &ckpt_writer;
    checkpoint_wait();   // the previous write first
    checkpoint_assemble(c, z, ck, dir, step, s, dl, rng, router_bias);
    if (z->grid->rank == 0) {
        ck->running = 1;
        ck->finished = 0;
        if (pthread_create(&ck->thread, NULL, checkpoint_write, ck) != 0) {
            fail("cannot start the checkpoint writer thread");
        }
    }
    if (!async) { checkpoint_wait(); }
    trace_end("checkpoint", "io", "\"step\":%d,\"async\":%d", step, async);
}

// The state file names its model file by CRC: the model file of the checkpoint must carry that CRC (one
// with none, or another, is not the model this state belongs to).
static void checkpoint_model_matches(const char *dir, int step, int model_crc, const char *state_path) {
    char path[PATH_LEN];
    path_join(path, dir, "model_%08d.bin", step);
    FILE *f = fopen_check(path, "rb");
    int h[256];
    fread_check(h, sizeof(int), 256, f, path);
    fclose(f);
    if (h[SH_CRC] == 0 || h[SH_CRC] != model_crc) {
        fail("model file '%s' is not the one '%s' was written with (its CRC-32 %08x, the state's %08x)", path,
             state_path, (uint32_t)h[SH_CRC], (uint32_t)model_crc);
    }
}

// Fails naming the tensor and the index of the first negative value of a file-order array (AdamW's v).
static void check_nonnegative(const ModelConfig *c, const float *all, const char *what) {
    size_t P = num_parameters(c);
    for (size_t i = 0; i < P; i++) {
        if (all[i] >= 0.0f) { continue; }
        size_t off = i;
        int id = 0;
        while (off >= tensor_full_size(c, id)) { off -= tensor_full_size(c, id); id++; }
        fail("%s: the optimizer's second moment (v) of %s[%zu] is %g: a mean of squares is never negative", what,
             tensor_names[id], off, all[i]);
    }
}

// The state file's form: a whole header, the magic, this version, and its CRC over header and body, which holds.
static void state_check_form(FILE *f, int h[256], const char *path) {
    if (fread(h, sizeof(int), 256, f) != 256) {
        fail("state file '%s' is truncated: expected a 1024-byte header", path);
    }
    if (h[0] != STATE_MAGIC) { fail("state file '%s' has bad magic %d, expected %d", path, h[0], STATE_MAGIC); }
    if (h[1] != STATE_VERSION) {
        fail("state file '%s' has version %d, expected %d: a checkpoint of an older version of train_gpt cannot be "
             "resumed (its model file loads with -e)", path, h[1], STATE_VERSION);
    }
    if (h[SH_CRC] == 0 || h[CRC_SCOPE_SLOT] != CRC_SCOPE_HEADER_AND_BODY) {
        fail("state file '%s' is corrupt: it has no CRC-32 of its header and body (slots %d, 255)", path, CRC_SCOPE_SLOT);
    }
    check_file_crc(f, h, path);
}

// The state file of checkpoint `step` in dir (its path into path) opened and its header h checked against this run
// (the model's parameters, the run, the data, -t, -d, the step counters, the size); positioned after the header.
static FILE *state_open_checked(const ModelConfig *c, const char *dir, int step, const TrainState *s,
                                const DataLoader *dl, int h[256], char *path) {
    size_t Pm = num_parameters(c);
    path_join(path, dir, "state_%08d.bin", step);
    FILE *f = fopen_check(path, "rb");
    state_check_form(f, h, path);
    checkpoint_model_matches(dir, step, h[SH_MODEL_CRC], path);
    if (state_run_id(h) != ckpt_run_id) {
        fail("state file '%s' is of run %016llx, this run is %016llx (the one main.log records): a resume continues "
             "only its own run", path, (unsigned long long)state_run_id(h), (unsigned long long)ckpt_run_id);
    }
    if ((uint32_t)h[SH_DATA_FP] != s->data_fp) {
        fail("-i: the training data differs from the data of the run that wrote '%s' (file names, token counts or "
             "first tokens): a resume continues the same data; to train its model on other data, start a new run "
             "with -e %s/model_%08d.bin", path, dir, step);
    }
    if (h[SH_OPTIMIZER] != s->muon) {
        fail("--optimizer: state file '%s' was written by a run with --optimizer %s, this run has %s: a resume keeps "
             "the optimizer", path, h[SH_OPTIMIZER] ? "muon" : "adamw", s->muon ? "muon" : "adamw");
    }
    uint64_t P = (uint32_t)h[SH_PARAMS_LO] | (uint64_t)(uint32_t)h[SH_PARAMS_HI] << 32;
    int nstates = h[SH_MASTER] ? 3 : 2;
    if (h[SH_STEP] != step || P != Pm || (h[SH_MASTER] != 0 && h[SH_MASTER] != 1)) {
        fail("state file '%s' does not belong to this checkpoint (step %d, %llu parameters; expected step %d, %zu)",
             path,
             h[SH_STEP], (unsigned long long)P, step, Pm);
    }
    if (h[SH_T] != s->T || h[SH_BATCH] != s->total_batch) {
        fail("state file '%s' was written with -t %d -d %d; this run has -t %d -d %d: a checkpoint resumes with the "
             "same sequence "
             "length and global batch (the layout may change)", path, h[SH_T], h[SH_BATCH], s->T, s->total_batch);
    }
    if (h[SH_UPDATES] < 0 || h[SH_SKIPS] < 0 || h[SH_UPDATES] + h[SH_SKIPS] != step || h[SH_SKIPS_IN_A_ROW] < 0
        || h[SH_SKIPS_IN_A_ROW] > h[SH_SKIPS]) {
        fail("state file '%s' has inconsistent step counters (step %d, %d updates, %d skipped, %d in a row)", path,
             step,
             h[SH_UPDATES], h[SH_SKIPS], h[SH_SKIPS_IN_A_ROW]);
    }
    if (h[SH_NSHARDS] != dl->nshards || h[SH_SHUFFLE] != dl->shuffle) {
        fail("state file '%s' was written reading %d data shards with --shuffle %d; this run reads %d with --shuffle "
             "%d", path,
             h[SH_NSHARDS], h[SH_SHUFFLE], dl->nshards, dl->shuffle);
    }
    long size = file_size(f);
    if ((uint64_t)size != 1024 + (uint64_t)nstates * P * sizeof(float)) {
        fail("state file '%s' is %ld bytes, expected %llu", path, size,
             (unsigned long long)(1024 + (uint64_t)nstates * P * sizeof(float)));
    }
    return f;
}

// Restores the optimizer state of this rank's part, the step counters, the data position and the
// generator from DIR/state_STEP.bin (the parameters come from the model file). Every field is checked
// before it is used.
static void checkpoint_load(const ModelConfig *c, Zero *z, const char *dir, int step, TrainState *s, DataLoader *dl,
                            Rng *rng) {
    Grid *g = z->grid;
    char path[PATH_LEN];
    int h[256];
    FILE *f = state_open_checked(c, dir, step, s, dl, h, path);
    uint64_t P = (uint32_t)h[SH_PARAMS_LO] | (uint64_t)(uint32_t)h[SH_PARAMS_HI] << 32;
    int nstates = h[SH_MASTER] ? 3 : 2;
    // every rank reads the whole state and keeps its part, unit by unit
    float *all = (float *)malloc_check(P * sizeof(float)), *full[NUM_TENSORS];
    split_tensors(c, all, full);
    for (int i = 0; i < nstates; i++) {
        fread_check(all, sizeof(float), P, f, path);
        check_finite(c, all, path);
        if (i == 1) { check_nonnegative(c, all, path); }   // AdamW's v: a mean of squares
        if (i == 2 && z->master == NULL) { continue; }   // fp32 parameters: no master weights to restore
        for (int u = 0; u < z->nunits; u++) {
            float *host = (float *)malloc_check(z->units[u].size * sizeof(float));
            unit_copy_full(c, &z->units[u], full, host, g->tp, g->tp_rank, 1);
            zero_set_unit_state(z, u, i, host);
            free(host);
        }
    }
    free(all);
    fclose(f);
    s->updates = h[SH_UPDATES]; s->skips = h[SH_SKIPS]; s->skips_in_a_row = h[SH_SKIPS_IN_A_ROW];
    s->max_steps = h[SH_MAX_STEPS];
    rng->s = (uint32_t)h[SH_RNG_LO] | (uint64_t)(uint32_t)h[SH_RNG_HI] << 32;
    if (rng->s == 0) { fail("state file '%s' holds the generator state 0, which no run can reach", path); }
    dataloader_seek_rounds(dl, (uint64_t)step * s->rounds);
}

#endif
