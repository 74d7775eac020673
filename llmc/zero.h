// Data parallelism and ZeRO stages 0-3 over the dp group, in one place.
//
// The parameters of a rank (its tp slice) are cut into UNITS: the embedding (wpe, wte), each
// transformer layer, the experts of each MoE layer, the final LayerNorm. Each unit is a contiguous
// block, padded to a multiple of the size p of its data-parallel group and cut into p equal SHARDS;
// rank r of the group owns shard r. The group is dp for every unit but the experts', which are
// replicated only over the edp group (the dp/ep x cp ranks holding the same experts: moe.h), so their
// gradients are summed, and their shards cut, over edp. Padding is zero and never reaches the
// model. Per stage:
//   0: full params, full grads, full AdamW state; after the last micro-batch each unit's gradient
//      is all-reduced (asynchronously, while earlier layers run their backward).
//   1: full params and grads; after the last micro-batch each unit's gradient is reduce-scattered in
//      place (the rank's shard of the sum lands in its own slice of the gradient buffer); AdamW state
//      (m, v, and the fp32 master on CUDA) exists for the shard only; after the update the shards
//      are all-gathered back into the full params.
//   2: as 1, but the gradients are kept as shards only: a full-size gradient exists for one unit
//      at a time (two, while the previous unit's reduce-scatter is in flight; the embedding's lives
//      through the whole backward, since the tied LM head and the token embedding both write it).
//      Every micro-batch reduce-scatters into the shard accumulator (memory-true, more traffic than
//      stage 1 with gradient accumulation).
//   3: as 2, and the params exist only as shards: a layer is all-gathered into one of two work
//      buffers right before its forward, dropped, gathered again before its backward (the embedding,
//      used by the first and the last op, has a buffer of its own; see WorkBuffers and zero_unit_params).
// The gradient of a loss scaled by 1/(global tokens) is summed over dp, so no averaging is needed.
#ifndef LLMC_ZERO_H
#define LLMC_ZERO_H

#include "comm.h"
#include "alloc.h"
#include "adamw.h"
#include "global_norm.h"
#include "residual.h"

#define MAX_UNIT_TENSORS 16

typedef struct {
    int id, layer;        // which model tensor (the caller's numbering), which layer (-1: none)
    int blk0, nblk;       // the caller's: the blocks of the tensor it holds (MoE: the local experts)
    size_t offset, size;  // within the unit, local (tp-sliced) elements
    int decay;            // weight decay applies
    int replicated;       // the same on every tp rank (counted once in the gradient norm)
    int muon;             // updated by Muon (muon.h), not AdamW
} UnitTensor;

typedef struct {
    int ntensors;
    UnitTensor t[MAX_UNIT_TENSORS];
    size_t size;                     // elements
    size_t nrep;                     // [0, nrep): replicated tensors whose gradients are partial sums
                                     // over tp under SP (LayerNorms, biases after row-parallel layers)
    Group *dpg;                      // its data-parallel group: dp, or edp for the experts
    size_t shard, padded;            // shard = ceil(size / dp); padded = shard * dp
    size_t full_offset, shard_offset;
    int embedding;   // holds wte (the token embedding and the tied LM head): its own work buffer
    int tied;        // pipeline: a copy of it lives on another stage; gradients summed over the emb group
    int norm_skip;   // pipeline: the last stage's copy, whose gradient the first stage counts in the norm
    size_t muon_before;   // Muon's owned elements in the units before this one (AdamW's v holds none of them)
} Unit;

// Three work buffers holding one full unit each (stage 3: gathered parameters; stages 2-3: the full
// gradients of the units whose backward is open or whose reduce-scatter is in flight). [2] is the
// embedding's. [0] and [1] serve the layers and the final LayerNorm with this eviction rule: a unit
// already in a buffer is used where it is; otherwise it goes into the buffer NOT used most recently
// (least recently used of two), evicting the unit there (gradients: after waiting for its
// reduce-scatter). So at most two layers are full at once, and a layer used twice in a row (the
// last layer's forward then backward, the first layers' backward then the next micro-batch's
// forward) is not gathered twice.
typedef struct {
    floatX *buf[3];
    int unit[3];     // which unit each holds, -1 none
    int last;        // of [0], [1]: the one used most recently
    CommRequest gather[3];   // stage 3 prefetch: the all-gather filling the buffer, while in flight
} WorkBuffers;

typedef struct {
    Grid *grid;
    int stage, sp;
    int nunits;
    Unit *units;
    size_t full_size, shard_size, max_layer_padded;
    size_t embed_padded;     // the largest unit with an embedding flag on this rank (wte, an untied head), 0 if none
    floatX *params;          // stages 0-2: every unit (full_size)
    floatX *params_shard;    // stage 3: this rank's shards (shard_size)
    WorkBuffers pw;          // stage 3: gathered parameters
    floatX *grads;           // stages 0-1: every unit
    floatX *grads_shard;     // stages 2-3: this rank's gradient shards, accumulated over micro-batches
    WorkBuffers gw;          // stages 2-3: full gradients of the units whose backward is open or reducing
    CommRequest *pending;    // per unit: its gradient reduction in flight
    float *m, *v, *master;   // AdamW state over the owned range (master only when floatX != float); Muon's elements
                             // (tensors marked muon, muon.h) keep their momentum in m and have no place in v
    size_t opt_size, v_size;
    float *norm_parts;       // device: one sum of squares per (unit, tensor)
    StepStats *stats;        // device: the step's loss, norm and gradient scale (global_norm.h)
    int prefetch;            // stage 3: gather the next unit while this one computes (zero_prefetch_params)
    double gathers[2];       // stage 3: unit all-gathers per group (dp, edp), as the calls counted
    double gathered_ring[2]; // stage 3: the gathered units' padded sizes x (p-1)/p (ring elements sent), summed
                             // over the units of the dp group [0] and of the experts' edp group [1]
} Zero;

static int work_find(const WorkBuffers *w, int u) {
    for (int i = 0; i < 3; i++) { if (w->unit[i] == u) { return i; } }
    return -1;
}

// The buffer unit u goes to: the embedding's own, or the layer buffer not used most recently.
static int work_pick(const WorkBuffers *w, int embedding) { return embedding ? 2 : 1 - w->last; }

static void work_set(WorkBuffers *w, int i, int u) {
    w->unit[i] = u;
    if (i < 2) { w->last = i; }
}

static void work_alloc(WorkBuffers *w, size_t layer_elems, size_t embedding_elems, MemCategory cat) {
    size_t sizes[3] = {layer_elems, layer_elems, embedding_elems};
    for (int i = 0; i < 3; i++) { w->buf[i] = (floatX *)mem_alloc(sizes[i] * floatx_bytes(), cat); w->unit[i] = -1; }
    w->last = 1;
}

// The part [a, b) of tensor t inside the unit range [start, end); 0 if empty.
static int tensor_overlap(const UnitTensor *t, size_t start, size_t end, size_t *a, size_t *b) {
    *a = t->offset > start ? t->offset : start;
    *b = t->offset + t->size < end ? t->offset + t->size : end;
    return *b > *a;
}

static void zero_owned_range(const Zero *z, int u, size_t *start, size_t *len);

// Sets each unit's muon_before; returns Muon's owned elements in all (0 without Muon).
static size_t zero_count_muon(Zero *z) {
    size_t n = 0, start, len, a, b;
    for (int u = 0; u < z->nunits; u++) {
        Unit *U = &z->units[u];
        U->muon_before = n;
        zero_owned_range(z, u, &start, &len);
        for (int k = 0; k < U->ntensors; k++) {
            if (U->t[k].muon && tensor_overlap(&U->t[k], start, start + len, &a, &b)) { n += b - a; }
        }
    }
    return n;
}

// Lays out the units (offsets, shards) and allocates every buffer of the chosen stage.
static void zero_init(Zero *z, Grid *grid, int stage, int sp, Unit *units, int nunits) {
    memset(z, 0, sizeof(*z));
    z->grid = grid; z->stage = stage; z->sp = sp; z->units = units; z->nunits = nunits;
    for (int u = 0; u < nunits; u++) {
        Unit *U = &units[u];
        U->shard = ceil_div(U->size, U->dpg->size);
        U->padded = U->shard * U->dpg->size;
        U->full_offset = z->full_size;
        U->shard_offset = z->shard_size;
        z->full_size += U->padded;
        z->shard_size += U->shard;
        if (U->embedding && U->padded > z->embed_padded) { z->embed_padded = U->padded; }
        else if (!U->embedding && U->padded > z->max_layer_padded) { z->max_layer_padded = U->padded; }
    }
    size_t embed_padded = z->embed_padded;
    size_t X = floatx_bytes();
    if (stage < 3) { z->params = (floatX *)mem_alloc(z->full_size * X, MEM_PARAMS); }
    else {
        z->params_shard = (floatX *)mem_alloc(z->shard_size * X, MEM_PARAMS);
        work_alloc(&z->pw, z->max_layer_padded, embed_padded, MEM_PARAMS);
    }
    if (stage < 2) { z->grads = (floatX *)mem_alloc(z->full_size * X, MEM_GRADS); }
    else {
        z->grads_shard = (floatX *)mem_alloc(z->shard_size * X, MEM_GRADS);
        work_alloc(&z->gw, z->max_layer_padded, embed_padded, MEM_GRADS);
    }
    z->pending = (CommRequest *)calloc_check(nunits, sizeof(CommRequest));
    z->opt_size = stage == 0 ? z->full_size : z->shard_size;
    z->v_size = z->opt_size - zero_count_muon(z);
    z->m = (float *)mem_alloc(z->opt_size * sizeof(float), MEM_OPTIMIZER);
    z->v = (float *)mem_alloc(z->v_size * sizeof(float), MEM_OPTIMIZER);
    z->master = floatx_bytes() != sizeof(float) ? (float *)mem_alloc(z->opt_size * sizeof(float), MEM_OPTIMIZER) : NULL;
    z->norm_parts = (float *)mem_alloc((size_t)nunits * MAX_UNIT_TENSORS * sizeof(float), MEM_WORKSPACE);
    z->stats = (StepStats *)mem_alloc(sizeof(StepStats), MEM_WORKSPACE);
}

// Zero's host memory (its device buffers are the allocator's: alloc.h).
static void zero_free(Zero *z) {
    free(z->pending);
    z->pending = NULL;
}

// First element of this rank's shard of unit u (0 at stage 0, which has no shards).
static size_t zero_shard_start(const Zero *z, int u) {
    return z->stage == 0 ? 0 : (size_t)z->units[u].dpg->rank * z->units[u].shard;
}

// The element range [start, start + len) of unit u that this rank updates (within the unit).
static void zero_owned_range(const Zero *z, int u, size_t *start, size_t *len) {
    const Unit *U = &z->units[u];
    if (z->stage == 0) { *start = 0; *len = U->size; return; }
    size_t s = zero_shard_start(z, u);
    size_t e = s + U->shard < U->size ? s + U->shard : U->size;
    *start = s;
    *len = e > s ? e - s : 0;
}

// ----------------------------------------------------------------------------
// parameters

// The full parameters of unit u, ready to use. Stage 3 all-gathers them into a work buffer unless
// they are still there (or on their way: a prefetch, waited for here): the embedding has its own (it is
// used first, by the token embedding, and last, by the tied LM head, so it stays gathered until the
// optimizer changes it); the layers and the final LayerNorm share two, the one not used most recently
// is overwritten. So a layer is gathered for its forward and again for its backward (but the last
// layer, still there), the final LayerNorm once per micro-batch (its backward follows the head at
// once), and layers 0 and 1 stay from one micro-batch's backward to the next one's forward.
static floatX *zero_unit_params(Zero *z, int u) {
    const Unit *U = &z->units[u];
    if (z->stage < 3) { return z->params + U->full_offset; }
    int i = work_find(&z->pw, u);
    if (i < 0) {
        i = work_pick(&z->pw, U->embedding);
        comm_wait(&z->pw.gather[i]);   // (a prefetch into it that was not used)
        comm_all_gather(U->dpg, z->params_shard + U->shard_offset, z->pw.buf[i], U->shard, DT_FLOATX, NULL);
        z->gathers[U->dpg == &z->grid->edp_group]++;
        z->gathered_ring[U->dpg == &z->grid->edp_group] += (U->dpg->size - 1.0) / U->dpg->size * U->padded;
    }
    comm_wait(&z->pw.gather[i]);
    work_set(&z->pw, i, u);
    return z->pw.buf[i];
}

// Stage 3 overlap: starts gathering unit u (a layer's or the final LayerNorm's) into the layer buffer
// that does not hold unit keep (the one in use), while the caller computes; zero_unit_params(u) then
// waits for it. The caller (the model's layer forward and backward) says what it will need next: the next layer, or
// a MoE layer's experts.
static void zero_prefetch_params(Zero *z, int u, int keep) {
    if (z->stage < 3 || !z->prefetch || u < 0) { return; }
    const Unit *U = &z->units[u];
    if (U->embedding || work_find(&z->pw, u) >= 0) { return; }
    int k = work_find(&z->pw, keep), i = k == 0 ? 1 : 0;
    comm_wait(&z->pw.gather[i]);
    z->pw.unit[i] = u;
    comm_all_gather(U->dpg, z->params_shard + U->shard_offset, z->pw.buf[i], U->shard, DT_FLOATX, &z->pw.gather[i]);
    z->gathers[U->dpg == &z->grid->edp_group]++;
    z->gathered_ring[U->dpg == &z->grid->edp_group] += (U->dpg->size - 1.0) / U->dpg->size * U->padded;
}

// Stage 3: forget the gathered units (their shards changed).
static void zero_release_params(Zero *z) { for (int i = 0; i < 3; i++) { comm_wait(&z->pw.gather[i]); z->pw.unit[i] = -1; } }

// Where the parameter at element `start` of unit u lives, for start inside the owned range.
static floatX *zero_owned_param(Zero *z, int u, size_t start) {
    const Unit *U = &z->units[u];
    if (z->stage < 3) { return z->params + U->full_offset + start; }
    return z->params_shard + U->shard_offset + (start - zero_shard_start(z, u));
}

// Where the AdamW state of element `start` of unit u lives (m, v and master share the layout).
static size_t zero_owned_state(const Zero *z, int u, size_t start) {
    const Unit *U = &z->units[u];
    if (z->stage == 0) { return U->full_offset + start; }
    return U->shard_offset + (start - zero_shard_start(z, u));
}

// Where AdamW's v of owned element a of unit u lives: its state index less Muon's elements before it (none without Muon).
static size_t zero_owned_vstate(const Zero *z, int u, size_t a) {
    const Unit *U = &z->units[u];
    size_t start, len, x, y, o = zero_owned_state(z, u, a) - U->muon_before;
    zero_owned_range(z, u, &start, &len);
    for (int k = 0; k < U->ntensors; k++) { if (U->t[k].muon && tensor_overlap(&U->t[k], start, a, &x, &y)) { o -= y - x; } }
    return o;
}

// Copies n elements of state `which` from the owned element `start` of unit u to (to_host) or from host. v has no
// place for Muon's elements: they read as 0 and are not written.
static void zero_copy_state(Zero *z, int u, int which, size_t start, size_t n, float *host, int to_host) {
    const Unit *U = &z->units[u];
    float *state = which == 0 ? z->m : which == 1 ? z->v : z->master;
    int muon = 0;
    for (int k = 0; k < U->ntensors; k++) { muon |= U->t[k].muon; }
    if (which != 1 || !muon) {   // (v of a unit without Muon's tensors: contiguous, after the units' Muon elements)
        float *d = state + (which == 1 ? zero_owned_vstate(z, u, start) : zero_owned_state(z, u, start));
        if (to_host) { copy_to_host(host, d, n * sizeof(float)); } else { copy_to_device(d, host, n * sizeof(float)); }
        return;
    }
    size_t a, b;
    if (to_host) { memset(host, 0, n * sizeof(float)); }
    for (int k = 0; k < U->ntensors; k++) {
        if (U->t[k].muon || !tensor_overlap(&U->t[k], start, start + n, &a, &b)) { continue; }
        float *d = state + zero_owned_vstate(z, u, a);
        if (to_host) { copy_to_host(host + (a - start), d, (b - a) * sizeof(float)); }
        else { copy_to_device(d, host + (a - start), (b - a) * sizeof(float)); }
    }
}

// Sets unit u from a host fp32 copy of the whole unit (U->size elements): the rank keeps what its
// stage stores, and the fp32 master of its owned range.
static void zero_set_unit_params(Zero *z, int u, const float *host) {
    const Unit *U = &z->units[u];
    float *padded = (float *)calloc(U->padded, sizeof(float));
    if (padded == NULL) { fail("out of host memory for a unit of %zu parameters", U->padded); }
    memcpy(padded, host, U->size * sizeof(float));
    size_t s0 = zero_shard_start(z, u), n = z->stage == 0 ? U->padded : U->shard;
    if (z->stage < 3) { upload_floats(z->params + U->full_offset, padded, U->padded); }
    else { upload_floats(z->params_shard + U->shard_offset, padded + s0, U->shard); }
    if (z->master) { copy_to_device(z->master + zero_owned_state(z, u, s0), padded + s0, n * sizeof(float)); }
    free(padded);
    zero_release_params(z);
}

// Reads unit u into a host fp32 buffer of U->size elements. Stage 3 gathers: every dp rank must call.
static void zero_get_unit_params(Zero *z, int u, float *host) {
    const Unit *U = &z->units[u];
    float *padded = (float *)malloc_check(U->padded * sizeof(float));
    download_floats(padded, zero_unit_params(z, u), U->padded);
    memcpy(host, padded, U->size * sizeof(float));
    free(padded);
}

// The AdamW state of unit u (which: 0 m, 1 v, 2 the fp32 master weights, NULL without one) as a host
// fp32 copy of the whole unit (U->size elements), for checkpoints: the owned shards all-gathered over
// the unit's group (stage 0: every rank holds it all). Every rank of the group must call.
static void zero_get_unit_state(Zero *z, int u, int which, float *host) {
    const Unit *U = &z->units[u];
    if (z->stage == 0) { zero_copy_state(z, u, which, 0, U->size, host, 1); return; }
    float *shard = (float *)malloc_check(U->shard * sizeof(float)),
        *padded = (float *)malloc_check(U->padded * sizeof(float));
    zero_copy_state(z, u, which, zero_shard_start(z, u), U->shard, shard, 1);
    comm_host_all_gather(U->dpg, shard, U->shard, padded, DT_FLOAT, "all-gather of optimizer state (checkpoint)");
    memcpy(host, padded, U->size * sizeof(float));
    free(shard); free(padded);
}

// Sets the owned part of state `which` of unit u from a host copy of the whole unit (resume).
static void zero_set_unit_state(Zero *z, int u, int which, const float *host) {
    size_t start, len;
    zero_owned_range(z, u, &start, &len);
    if (len > 0) { zero_copy_state(z, u, which, start, len, (float *)host + start, 0); }
}

// ----------------------------------------------------------------------------
// gradients

static void zero_clear_grads(Zero *z) {
    if (z->grads) { memset_zero_device(z->grads, z->full_size * sizeof(floatX)); }
    if (z->grads_shard) { memset_zero_device(z->grads_shard, z->shard_size * sizeof(floatX)); }
}

// Stages 2-3: waits for the reduce-scatter of the unit in gradient buffer i and adds the rank's
// shard of the sum (left in place, at its own offset of the buffer) to the shard accumulator.
static void zero_finish_work(Zero *z, int i) {
    int u = z->gw.unit[i];
    if (u < 0) { return; }
    const Unit *U = &z->units[u];
    comm_wait(&z->pending[u]);
    accumulate(z->grads_shard + U->shard_offset, z->gw.buf[i] + zero_shard_start(z, u), U->shard);
    z->gw.unit[i] = -1;
}

// Opens the backward of unit u: the buffer its gradient accumulates into (zeroed at stages 2-3).
static floatX *zero_begin_unit_backward(Zero *z, int u) {
    const Unit *U = &z->units[u];
    if (z->stage < 2) { return z->grads + U->full_offset; }
    int held = work_find(&z->gw, u);   // u's previous micro-batch (pipelines: not always in the same buffer)
    if (held >= 0) { zero_finish_work(z, held); }
    int i = work_pick(&z->gw, U->embedding);
    zero_finish_work(z, i);   // the buffer's previous unit must be reduced first
    work_set(&z->gw, i, u);
    memset_zero_device(z->gw.buf[i], U->padded * sizeof(floatX));
    return z->gw.buf[i];
}

// The gradient buffer of unit u while its backward is open (e.g. the embedding: opened by the head).
static floatX *zero_unit_grads(Zero *z, int u) {
    if (z->stage < 2) { return z->grads + z->units[u].full_offset; }
    return z->gw.buf[work_find(&z->gw, u)];
}

// Closes the backward of unit u: under SP all-reduce its replicated (partial) gradients over tp,
// then start its data-parallel reduction. At stages 0-1 only after the last micro-batch.
static void zero_end_unit_backward(Zero *z, int u, int last_micro) {
    const Unit *U = &z->units[u];
    if (z->stage < 2 && !last_micro) { return; }
    floatX *g = zero_unit_grads(z, u);
    if (z->sp && U->nrep > 0) { comm_all_reduce(&z->grid->tp_group, g, U->nrep, DT_FLOATX, NULL); }
    Group *dp = U->dpg;
    if (z->stage == 0) { comm_all_reduce(dp, g, U->padded, DT_FLOATX, &z->pending[u]); }
    else { comm_reduce_scatter(dp, g, g + (size_t)dp->rank * U->shard, U->shard, DT_FLOATX, &z->pending[u]); }
}

// Where the reduced gradient of element `start` of unit u lives, for start inside this rank's shard
// (stages 0-1: its place in the full gradient buffer; stages 2-3: the shard accumulator).
static floatX *zero_owned_grad(Zero *z, int u, size_t start) {
    const Unit *U = &z->units[u];
    if (z->stage < 2) { return z->grads + U->full_offset + start; }
    return z->grads_shard + U->shard_offset + (start - zero_shard_start(z, u));
}

// Waits for every gradient reduction of this step. After it, the owned gradients are final. A unit
// tied to a copy on another pipeline stage (the embedding: wte is the token embedding on the first
// stage and the LM head on the last) then sums its reduced gradient with the copy's, shard by shard
// (both copies have the same layout, so the same shards), and both stages take the same step.
static void zero_finish_grads(Zero *z) {
    if (z->stage >= 2) { for (int i = 0; i < 3; i++) { zero_finish_work(z, i); } }
    else { for (int u = 0; u < z->nunits; u++) { comm_wait(&z->pending[u]); } }
    for (int u = 0; u < z->nunits; u++) {
        if (!z->units[u].tied) { continue; }
        size_t s0 = zero_shard_start(z, u), n = z->stage == 0 ? z->units[u].padded : z->units[u].shard;
        comm_all_reduce(&z->grid->emb_group, zero_owned_grad(z, u, s0), n, DT_FLOATX, NULL);
    }
}

// Copies the owned, reduced gradient of unit u to the host; returns its range within the unit.
static void zero_get_owned_grads(Zero *z, int u, float *host, size_t *start, size_t *len) {
    zero_owned_range(z, u, start, len);
    if (*len > 0) { download_floats(host, zero_owned_grad(z, u, *start), *len); }
}

// ----------------------------------------------------------------------------
// the optimizer step

// Global gradient norm. Every rank sums the squares of the gradient elements of its partition of each
// unit over the unit's data-parallel group (also at stage 0, where every rank holds all of them, so
// nothing counts twice; an expert's replicas over edp likewise, and other ep ranks hold other experts),
// tensors replicated over tp only on tp rank 0, the tied embedding only on the first pipeline stage.
// One sum over the world gives the norm, each parameter counted once. Ranges that follow each other in
// memory (a unit's tensors, and the next unit's) are summed as one: a few launches per step, not two per
// tensor. The partial sums stay on the device (z->norm_parts); returns how many.
static int zero_grad_norm_parts(Zero *z) {
    int nparts = 0;
    floatX *run = NULL;   // the range being gathered: run .. run + run_len
    size_t run_len = 0;
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        if (U->norm_skip) { continue; }
        size_t start = (size_t)U->dpg->rank * U->shard, a, b;
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *t = &U->t[k];
            if (t->replicated && z->grid->tp_rank != 0) { continue; }
            if (!tensor_overlap(t, start, start + U->shard, &a, &b)) { continue; }
            floatX *g = z->stage < 2 ? z->grads + U->full_offset + a : z->grads_shard + U->shard_offset + (a - start);
            if (run != NULL && g == run + run_len) { run_len += b - a; continue; }
            if (run != NULL) { sum_of_squares(z->norm_parts + nparts++, run, run_len); }
            run = g;
            run_len = b - a;
        }
    }
    if (run != NULL) { sum_of_squares(z->norm_parts + nparts++, run, run_len); }
    return nparts;
}

static_assert(ADAMW_MAX_SEGMENTS >= MAX_UNIT_TENSORS, "a unit's tensors must fit one AdamW update");

// AdamW on the owned range of every unit, one update per unit with a segment per tensor (weight decay
// only where t->decay), then (stages 1-2) all-gather the updated shards into the full parameters. The
// gradients are scaled by *grad_scale, on the device (0: the update is skipped; the gather then copies
// the unchanged shards).
static void zero_optimizer_step(Zero *z, float lr, float beta1, float beta2, float eps, float weight_decay,
                                const float *grad_scale, int t, unsigned int seed) {
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        size_t start, len, a, b;
        zero_owned_range(z, u, &start, &len);
        AdamWSegments sg = {0};
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *T = &U->t[k];
            if (T->muon || !tensor_overlap(T, start, start + len, &a, &b)) { continue; }
            // the rounding seed depends on the element's place in its tensor, not on the layout, so
            // the two copies of a tied tensor round alike
            unsigned tensor_seed = seed + 1000003u * (unsigned)(T->id * 4096 + T->layer + 1) + (unsigned)(a - T->offset);
            sg.s[sg.n++] = (AdamWSegment){a - start, b - a, T->decay ? weight_decay : 0.0f, tensor_seed,
                                          zero_owned_vstate(z, u, a)};
        }
        if (sg.n > 0) {
            size_t o = zero_owned_state(z, u, start);
            adamw_update_segments(zero_owned_param(z, u, start), z->master ? z->master + o : NULL,
                                  zero_owned_grad(z, u, start),
                                  z->m + o, z->v, &sg, lr, beta1, beta2, eps, grad_scale, t);
        }
        if (z->stage == 1 || z->stage == 2) {
            floatX *full = z->params + U->full_offset;
            comm_all_gather(U->dpg, full + zero_shard_start(z, u), full, U->shard, DT_FLOATX, NULL);
        }
    }
    zero_release_params(z);
}

// Test hook (test_hooks.h): a NaN in one gradient element.
static void zero_poison_gradient(Zero *z) {
    float nan = NAN;
    upload_floats(z->stage < 2 ? z->grads : z->grads_shard, &nan, 1);
}

#endif
