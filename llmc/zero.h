// Data parallelism and ZeRO stages 0-3 over the dp group, in one place.
//
// The parameters of a rank (its tp slice) are cut into UNITS: the embedding (wpe, wte), each
// transformer layer, the final LayerNorm. Each unit is a contiguous block, padded to a multiple of
// dp and cut into dp equal SHARDS; dp rank r owns shard r of every unit. Padding is zero and never
// reaches the model. Per stage:
//   0: full params, full grads, full AdamW state; after the last micro-batch each unit's gradient
//      is all-reduced (asynchronously, while earlier layers run their backward).
//   1: full params and grads; each unit's gradient is reduce-scattered into the rank's shard; AdamW
//      state (m, v, and the fp32 master on CUDA) exists for the shard only; after the update the
//      shards are all-gathered back into the full params.
//   2: as 1, but full-size gradients exist only for one unit at a time (two, while the previous
//      unit's reduce-scatter is in flight; the embedding's lives through the whole backward since the
//      tied LM head and the token embedding both write it). Every micro-batch reduce-scatters into
//      the shard accumulator (memory-true, more traffic than stage 1 with accumulation).
//   3: as 2, and the params exist only as shards: a layer is all-gathered into one of two work
//      buffers right before its forward, dropped, gathered again before its backward (the embedding,
//      used by the first and the last op, has a buffer of its own; see zero_fetch_params).
// The gradient of a loss scaled by 1/(global tokens) is summed over dp, so no averaging is needed.
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include "comm.h"
#include "alloc.h"
#include "adamw.h"
#include "global_norm.h"
#include "residual.h"

#define MAX_UNIT_TENSORS 12

typedef struct {
    int id, layer;        // which model tensor (the caller's numbering), which layer (-1: none)
    size_t offset, size;  // within the unit, local (tp-sliced) elements
    int decay;            // weight decay applies
    int replicated;       // the same on every tp rank (its gradient is partial under SP)
} UnitTensor;

typedef struct {
    int ntensors;
    UnitTensor t[MAX_UNIT_TENSORS];  // replicated tensors first, so they form one block [0, nrep)
    size_t size, nrep;               // elements; of which replicated
    size_t shard, padded;            // shard = ceil(size / dp); padded = shard * dp
    size_t full_offset, shard_offset;
} Unit;

typedef struct {
    Grid *grid;
    int stage, sp;
    int nunits;
    Unit *units;
    size_t full_size, shard_size, max_padded;
    floatX *params;          // stages 0-2: every unit (full_size)
    floatX *params_shard;    // stage 3: this rank's shards (shard_size)
    floatX *param_work[3];   // stage 3: gathered units: [0], [1] layers (and the final LN), [2] the embedding
    int work_unit[3], work_last;
    floatX *grads;           // stages 0-1: every unit
    floatX *grads_shard;     // stages 1-3: this rank's gradient shards
    floatX *grad_work[3];    // stages 2-3: [0], [1] ping-pong for the layers, [2] the embedding unit
    floatX *rs_recv[3];      // stages 2-3: reduce-scatter landing buffers, one per work buffer
    int slot_unit[3], next_layer_slot;
    CommRequest *pending;    // per unit: its gradient reduction in flight
    float *m, *v, *master;   // AdamW state over the owned range (master only when floatX != float)
    size_t opt_size;
    float *norm_parts;       // device: one sum of squares per (unit, tensor)
    long gathers;            // stage 3: unit all-gathers this step (for the comm report)
} Zero;

// Stages 2-3: the work slot holding unit u's gradient, or -1.
static int zero_slot_holding(const Zero *z, int u) {
    for (int i = 0; i < 3; i++) { if (z->slot_unit[i] == u) { return i; } }
    return -1;
}

// Lays out the units (offsets, shards) and allocates every buffer of the chosen stage.
static void zero_init(Zero *z, Grid *grid, int stage, int sp, Unit *units, int nunits) {
    z->grid = grid; z->stage = stage; z->sp = sp; z->units = units; z->nunits = nunits;
    int dp = grid->dp;
    z->full_size = 0; z->shard_size = 0; z->max_padded = 0;
    size_t max_layer_padded = 0;
    for (int u = 0; u < nunits; u++) {
        Unit *U = &units[u];
        U->shard = ceil_div(U->size, dp);
        U->padded = U->shard * dp;
        U->full_offset = z->full_size;
        U->shard_offset = z->shard_size;
        z->full_size += U->padded;
        z->shard_size += U->shard;
        if (U->padded > z->max_padded) { z->max_padded = U->padded; }
        if (u != 0 && U->padded > max_layer_padded) { max_layer_padded = U->padded; }
    }
    size_t X = sizeof(floatX);
    z->params = z->params_shard = z->grads = z->grads_shard = NULL;
    for (int i = 0; i < 3; i++) { z->grad_work[i] = NULL; z->rs_recv[i] = NULL; z->slot_unit[i] = -1; }
    z->next_layer_slot = 0;
    z->param_work[0] = z->param_work[1] = z->param_work[2] = NULL;
    if (stage < 3) {
        z->params = (floatX *)mem_alloc(z->full_size * X, MEM_PARAMS);
    } else {
        z->params_shard = (floatX *)mem_alloc(z->shard_size * X, MEM_PARAMS);
        size_t sizes[3] = {max_layer_padded, max_layer_padded, units[0].padded};
        for (int i = 0; i < 3; i++) { z->param_work[i] = (floatX *)mem_alloc(sizes[i] * X, MEM_PARAMS); z->work_unit[i] = -1; }
        z->work_last = 1;
    }
    if (stage < 2) { z->grads = (floatX *)mem_alloc(z->full_size * X, MEM_GRADS); }
    if (stage >= 1) { z->grads_shard = (floatX *)mem_alloc(z->shard_size * X, MEM_GRADS); }
    if (stage >= 2) {
        size_t sizes[3] = {max_layer_padded, max_layer_padded, units[0].padded};
        for (int i = 0; i < 3; i++) {
            z->grad_work[i] = (floatX *)mem_alloc(sizes[i] * X, MEM_GRADS);
            z->rs_recv[i] = (floatX *)mem_alloc(sizes[i] / dp * X, MEM_COMM);
        }
    }
    z->pending = (CommRequest *)calloc(nunits, sizeof(CommRequest));
    z->opt_size = stage == 0 ? z->full_size : z->shard_size;
    z->m = (float *)mem_alloc(z->opt_size * sizeof(float), MEM_OPTIMIZER);
    z->v = (float *)mem_alloc(z->opt_size * sizeof(float), MEM_OPTIMIZER);
    z->master = sizeof(floatX) != sizeof(float) ? (float *)mem_alloc(z->opt_size * sizeof(float), MEM_OPTIMIZER) : NULL;
    z->norm_parts = (float *)mem_alloc((size_t)nunits * MAX_UNIT_TENSORS * sizeof(float), MEM_WORKSPACE);
    z->gathers = 0;
}

// The element range [start, start + len) of unit u that this rank updates (within the unit).
static void zero_owned_range(const Zero *z, int u, size_t *start, size_t *len) {
    const Unit *U = &z->units[u];
    if (z->stage == 0) { *start = 0; *len = U->size; return; }
    size_t s = (size_t)z->grid->dp_rank * U->shard;
    size_t e = s + U->shard < U->size ? s + U->shard : U->size;
    *start = s;
    *len = e > s ? e - s : 0;
}

// ----------------------------------------------------------------------------
// parameters

// The full parameters of unit u, ready to use. Stage 3 all-gathers them into a work buffer unless
// they are still there: the embedding has its own (it is used first, by the token embedding, and
// last, by the tied LM head, so it stays gathered until the optimizer changes it); the layers and the
// final LayerNorm share two, the one not used most recently is overwritten. So a layer is gathered
// for its forward and again for its backward, the final LayerNorm once per micro-batch (its backward
// follows the head at once), and layers 0 and 1 stay from one micro-batch's backward to the next forward.
static floatX *zero_fetch_params(Zero *z, int u) {
    const Unit *U = &z->units[u];
    if (z->stage < 3) { return z->params + U->full_offset; }
    int slot;
    if (u == 0) {
        slot = 2;
        if (z->work_unit[2] == 0) { return z->param_work[2]; }
    } else {
        for (int i = 0; i < 2; i++) { if (z->work_unit[i] == u) { z->work_last = i; return z->param_work[i]; } }
        slot = 1 - z->work_last;
        z->work_last = slot;
    }
    comm_all_gather(&z->grid->dp_group, z->params_shard + U->shard_offset, z->param_work[slot], U->shard, DT_FLOATX, NULL);
    z->work_unit[slot] = u;
    z->gathers++;
    return z->param_work[slot];
}

// Stage 3: forget the gathered units (their shards changed).
static void zero_release_params(Zero *z) { z->work_unit[0] = z->work_unit[1] = z->work_unit[2] = -1; }

// Sets unit u from a host fp32 copy of the whole unit (U->size elements): the rank keeps what its
// stage stores, and the fp32 master of its owned range.
static void zero_set_unit_params(Zero *z, int u, const float *host) {
    const Unit *U = &z->units[u];
    float *padded = (float *)calloc(U->padded, sizeof(float));
    memcpy(padded, host, U->size * sizeof(float));
    size_t s0 = (size_t)z->grid->dp_rank * U->shard;
    if (z->stage < 3) { upload_floats(z->params + U->full_offset, padded, U->padded); }
    else { upload_floats(z->params_shard + U->shard_offset, padded + s0, U->shard); }
    if (z->master) {
        size_t off = z->stage == 0 ? U->full_offset : U->shard_offset;
        size_t start = z->stage == 0 ? 0 : s0, n = z->stage == 0 ? U->padded : U->shard;
        copy_to_device(z->master + off, padded + start, n * sizeof(float));
    }
    free(padded);
    zero_release_params(z);
}

// Reads unit u into a host fp32 buffer of U->size elements. Stage 3 gathers: every dp rank must call.
static void zero_get_unit_params(Zero *z, int u, float *host) {
    const Unit *U = &z->units[u];
    float *padded = (float *)malloc_check(U->padded * sizeof(float));
    download_floats(padded, zero_fetch_params(z, u), U->padded);
    memcpy(host, padded, U->size * sizeof(float));
    free(padded);
}

// ----------------------------------------------------------------------------
// gradients

static void zero_zero_grads(Zero *z) {
    if (z->grads) { zero_on_device(z->grads, z->full_size * sizeof(floatX)); }
    if (z->grads_shard) { zero_on_device(z->grads_shard, z->shard_size * sizeof(floatX)); }
}

// Finishes the reduction that used work slot i (stages 2-3): adds the received shard.
static void zero_finish_slot(Zero *z, int i) {
    int u = z->slot_unit[i];
    if (u < 0) { return; }
    const Unit *U = &z->units[u];
    comm_wait(&z->pending[u]);
    accumulate(z->grads_shard + U->shard_offset, z->rs_recv[i], U->shard);
    z->slot_unit[i] = -1;
}

// The buffer the backward of unit u accumulates its gradient into (zeroed at stages 2-3).
static floatX *zero_begin_unit_backward(Zero *z, int u) {
    const Unit *U = &z->units[u];
    if (z->stage < 2) { return z->grads + U->full_offset; }
    int i = 2;                       // the embedding unit has its own buffer
    if (u != 0) { i = z->next_layer_slot; z->next_layer_slot ^= 1; }
    zero_finish_slot(z, i);   // the previous user of this buffer must be reduced first
    z->slot_unit[i] = u;
    zero_on_device(z->grad_work[i], U->padded * sizeof(floatX));
    return z->grad_work[i];
}

// The gradient buffer of unit u while its backward is open (e.g. the embedding: opened by the head).
static floatX *zero_unit_grads(Zero *z, int u) {
    if (z->stage < 2) { return z->grads + z->units[u].full_offset; }
    return z->grad_work[zero_slot_holding(z, u)];
}

// The backward of unit u is done: under SP all-reduce its replicated (partial) gradients over tp,
// then start its data-parallel reduction. At stages 0-1 only after the last micro-batch.
static void zero_end_unit_backward(Zero *z, int u, int last_micro) {
    const Unit *U = &z->units[u];
    if (z->stage < 2 && !last_micro) { return; }
    int slot = zero_slot_holding(z, u);
    floatX *g = z->stage < 2 ? z->grads + U->full_offset : z->grad_work[slot];
    if (z->sp && U->nrep > 0) { comm_all_reduce(&z->grid->tp_group, g, U->nrep, DT_FLOATX, NULL); }
    Group *dp = &z->grid->dp_group;
    if (dp->size == 1 && z->stage == 0) { return; }
    if (z->stage == 0) {
        comm_all_reduce(dp, g, U->padded, DT_FLOATX, &z->pending[u]);
    } else if (z->stage == 1) {
        comm_reduce_scatter(dp, g, z->grads_shard + U->shard_offset, U->shard, DT_FLOATX, &z->pending[u]);
    } else {
        comm_reduce_scatter(dp, g, z->rs_recv[slot], U->shard, DT_FLOATX, &z->pending[u]);
    }
}

// Waits for every gradient reduction of this step. After it, the owned gradients are final.
static void zero_finish_grads(Zero *z) {
    if (z->stage >= 2) { for (int i = 0; i < 3; i++) { zero_finish_slot(z, i); } }
    else { for (int u = 0; u < z->nunits; u++) { comm_wait(&z->pending[u]); } }
}

// Where the reduced gradient of element `start` of unit u lives (start inside the owned range).
static floatX *zero_owned_grad(Zero *z, int u, size_t start) {
    const Unit *U = &z->units[u];
    if (z->stage == 0) { return z->grads + U->full_offset + start; }
    return z->grads_shard + U->shard_offset + (start - (size_t)z->grid->dp_rank * U->shard);
}

// Copies the owned, reduced gradient of unit u to the host; returns its range within the unit.
static void zero_get_owned_grads(Zero *z, int u, float *host, size_t *start, size_t *len) {
    zero_owned_range(z, u, start, len);
    if (*len > 0) { download_floats(host, zero_owned_grad(z, u, *start), *len); }
}

// ----------------------------------------------------------------------------
// the optimizer step

// Global gradient norm. Every rank sums the squares of the gradient elements it owns: its dp
// partition of each unit (also at stage 0, where every rank holds all of them, so nothing counts
// twice), tensors replicated over tp only on tp rank 0. One sum over the world gives the norm.
static float zero_grad_norm(Zero *z) {
    int nparts = 0;
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        size_t start = (size_t)z->grid->dp_rank * U->shard, end = start + U->shard;
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *t = &U->t[k];
            if (t->replicated && z->grid->tp_rank != 0) { continue; }
            size_t a = t->offset > start ? t->offset : start;
            size_t b = t->offset + t->size < end ? t->offset + t->size : end;
            if (b <= a) { continue; }
            floatX *g = z->stage == 0 ? z->grads + U->full_offset + a : z->grads_shard + U->shard_offset + (a - start);
            sum_of_squares(z->norm_parts + nparts++, g, b - a);
        }
    }
    float *parts = (float *)malloc_check(sizeof(float) * (nparts + 1));
    if (nparts > 0) { copy_to_host(parts, z->norm_parts, sizeof(float) * nparts); }
    double sum = 0.0;
    for (int i = 0; i < nparts; i++) { sum += parts[i]; }
    free(parts);
    comm_sum_host(&z->grid->world, &sum, 1);
    return (float)sqrt(sum);
}

// AdamW on the owned range of every unit, tensor by tensor (weight decay only where t->decay),
// then (stages 1-2) all-gather the updated shards into the full parameters.
static void zero_optimizer_step(Zero *z, float lr, float beta1, float beta2, float eps, float weight_decay,
                                float grad_scale, int t, unsigned int seed) {
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        size_t start, len;
        zero_owned_range(z, u, &start, &len);
        size_t s0 = z->stage == 0 ? 0 : (size_t)z->grid->dp_rank * U->shard;   // first owned element
        size_t opt0 = z->stage == 0 ? U->full_offset : U->shard_offset;       // its AdamW state
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *T = &U->t[k];
            size_t a = T->offset > start ? T->offset : start;
            size_t b = T->offset + T->size < start + len ? T->offset + T->size : start + len;
            if (b <= a) { continue; }
            floatX *p = z->stage < 3 ? z->params + U->full_offset + a : z->params_shard + U->shard_offset + (a - s0);
            size_t o = opt0 + (a - s0);
            adamw_update(p, z->master ? z->master + o : NULL, zero_owned_grad(z, u, a), z->m + o, z->v + o, b - a,
                         lr, beta1, beta2, eps, T->decay ? weight_decay : 0.0f, grad_scale, t, seed + (unsigned)o);
        }
        if (z->stage == 1 || z->stage == 2) {
            floatX *full = z->params + U->full_offset;
            comm_all_gather(&z->grid->dp_group, full + s0, full, U->shard, DT_FLOATX, NULL);
        }
    }
    zero_release_params(z);
}

#endif
