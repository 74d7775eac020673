// Pipeline parallelism, in one place: the schedules (1F1B, GPipe, interleaved 1F1B, zero-bubble ZB-H1) and the
// point-to-point exchanges between neighbouring stages (pipeline_split.h cuts the layers into the stages).
//
// The L layers are cut into pp stages of contiguous layers (pipeline_split.h); the first stage also runs
// the embedding, the last one the final LayerNorm, the LM head and the loss. A step's m micro-batches
// (the gradient accumulation steps) flow through the stages: stage s receives micro-batch i's input
// from stage s-1, runs its layers, sends the output to s+1; the backward sends the gradient of the
// input back to s-1. Each boundary tensor is (B*T/tp_sp, C): the residual stream.
//
//   GPipe: all m forwards, then all m backwards. Every micro-batch's activations are alive at once.
//   1F1B (Megatron): stage s runs pp-s-1 warm-up forwards, then alternates one forward and one
//         backward (steady state), then the remaining backwards (cool-down). At most pp-s micro-batches
//         are alive on stage s, whatever m is. Same bubble as GPipe: (pp-1)/(m+pp-1) of the step.
//
//   stage 0  F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 ..          (pp = 4, 1F1B: 3 warm-up forwards)
//   stage 3  .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 ..             (no warm-up: forward, backward, ...)
//
//   ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; --pp-schedule zb): each backward is split
//         into B, the gradient of the stage's input (what the previous stage waits for), and W, the gradients
//         of its weights (which nobody waits for). B takes the backward's place in 1F1B; the W passes run
//         while the stage waits for a message, in micro-batch order: stage s keeps up to s of them pending
//         through the steady state and spends them in the cool-down, where it would otherwise wait about s
//         backwards for the stages before it. The bubble drops from (pp-1)(F+B+W) to (pp-1)(F+B-W). A pending
//         W keeps its micro-batch's activations (stage s: pp-s-1 warm-up micro-batches + 1 + s pending = pp,
//         1F1B's first stage's number: a received input waits in a buffer of its own until its forward takes
//         a slot) and the gradients of its layers' outputs (the model's W store).
//
//   stage 0  F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 ..     (pp = 4, in order, not to scale: stage 0 runs a W
//   stage 3  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 ..  as soon as one is pending, stage 3 keeps 3 pending)
//
//   Interleaved 1F1B (Megatron's virtual pipeline, --vpp): the layers are cut into pp*vpp chunks and
//         rank r holds vpp of them, chunks r, r+pp, r+2pp, ... (its "model chunks" v = 0..vpp-1). A micro-
//         batch goes around the ranks vpp times: rank pp-1's chunk v feeds rank 0's chunk v+1. Micro-
//         batches go in groups of pp through chunk 0, then the same group through chunk 1, ... (so m
//         must be a multiple of pp), the backward through the chunks in reverse. Each rank's work is vpp
//         times finer, and the bubble vpp times smaller: (pp-1)/(vpp*m+pp-1) of the step; the price is vpp
//         times the boundary traffic and more micro-batches of activations alive on the first ranks.
//
// A schedule is a list of steps per rank (pipeline_steps): run a forward and/or a backward, then one
// exchange with the neighbours, all of its sends and receives started together so that neighbours
// never wait on each other's sends (Megatron's names: send_forward / recv_forward move activations
// to the next stage, send_backward / recv_backward move gradients to the previous one). Every rank can
// build every rank's list; pipeline_run executes this rank's. Without SP every tp rank holds the same
// boundary tensor: each sends only its 1/tp slice and the receivers all-gather it over tp (Megatron's
// scatter-gather), so the link between stages carries it once, not tp times. With --overlap the
// sends do not block: a stage goes on with its next forward or backward while its output (or its
// input's gradient, copied aside) is in flight, and waits for them at its next exchange. Time spent in
// the exchanges is the bubble (wait_seconds), measured when asked (time_waits): the device is then
// synchronised around each exchange, which a GPU step otherwise never waits for (the NCCL sends and
// receives are ordered on the streams, as the MPI ones are in the host's program order).
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <time.h>
#include "alloc.h"
#include "comm.h"

typedef enum { SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_INTERLEAVED, SCHEDULE_ZB } PipeSchedule;

// --pp-schedule's name -> the schedule
static PipeSchedule pipe_schedule(const char *name) {
    return !strcmp(name, "gpipe") ? SCHEDULE_GPIPE : !strcmp(name, "interleaved") ? SCHEDULE_INTERLEAVED
            : !strcmp(name, "zb") ? SCHEDULE_ZB : SCHEDULE_1F1B;
}

// The k-th forward (or backward) of a rank, k = 0 .. m*vpp-1: its model chunk and its micro-batch.
// Groups of pp micro-batches pass chunk 0, then chunk 1, ...; the backward takes the chunks in reverse.
static int schedule_chunk(int k, int pp, int vpp, int forward) {
    int c = (k % (pp * vpp) + pp * vpp) % (pp * vpp) / pp;   // (k < 0: counted back from the previous group)
    return forward ? c : vpp - 1 - c;
}
static int schedule_micro(int k, int pp, int vpp) { return k / (pp * vpp) * pp + k % pp; }

// One step of a rank's schedule: forward k (-1: none), backward k (-1: none), then the exchange: send
// that forward's output to the next stage, send that backward's input gradient to the previous one,
// receive the input of forward recv_fwd (-1: none) from the previous stage, receive the gradient of
// backward recv_bwd's output (-1: none) from the next one. ZB: wgt, the W pass of backward k (-1: none),
// runs while the exchange's messages are in flight (its backward's B ran earlier).
typedef struct { int fwd, bwd, send_fwd, send_bwd, recv_fwd, recv_bwd, wgt; } PipeStep;

typedef struct {
    PipeStep *s;
    int n, cap;
    int pp, vpp, rank;
    int n_total;   // forwards (= backwards) of the rank: m*vpp
} StepList;

// Adds a step, leaving out what does not apply: chunk 0 of rank 0 receives no input (the embedding
// makes it) and sends no gradient; the last chunk of rank pp-1 sends no output (the head takes it)
// and receives no gradient. A step left with nothing to do is dropped.
static void add_step_w(StepList *l, int fwd, int bwd, int send_fwd, int send_bwd, int recv_fwd, int recv_bwd, int wgt) {
    int pp = l->pp, vpp = l->vpp, r = l->rank;
    #define FIRST_CHUNK(k, fw) (r == 0 && schedule_chunk(k, pp, vpp, fw) == 0)
    #define LAST_CHUNK(k, fw) (r == pp - 1 && schedule_chunk(k, pp, vpp, fw) == vpp - 1)
    if (send_fwd && LAST_CHUNK(fwd, 1)) { send_fwd = 0; }
    if (send_bwd && FIRST_CHUNK(bwd, 0)) { send_bwd = 0; }
    if (recv_fwd >= 0 && FIRST_CHUNK(recv_fwd, 1)) { recv_fwd = -1; }
    if (recv_bwd >= 0 && LAST_CHUNK(recv_bwd, 0)) { recv_bwd = -1; }
    #undef FIRST_CHUNK
    #undef LAST_CHUNK
    if (fwd < 0 && bwd < 0 && !send_fwd && !send_bwd && recv_fwd < 0 && recv_bwd < 0 && wgt < 0) { return; }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->s = (PipeStep *)realloc_check(l->s, l->cap * sizeof(PipeStep));
    }
    l->s[l->n++] = (PipeStep){fwd, bwd, send_fwd, send_bwd, recv_fwd, recv_bwd, wgt};
}
static void add_step(StepList *l, int fwd, int bwd, int send_fwd, int send_bwd, int recv_fwd, int recv_bwd) {
    add_step_w(l, fwd, bwd, send_fwd, send_bwd, recv_fwd, recv_bwd, -1);
}

// 1F1B and GPipe (vpp = 1): the exchanges go one way at a time, with one neighbour each.
static void steps_1f1b(StepList *l, int m, int gpipe) {
    int pp = l->pp, s = l->rank;
    int warm = gpipe ? m : (pp - s - 1 < m ? pp - s - 1 : m), steady = m - warm;
    for (int i = 0; i < warm; i++) {          // warm-up (GPipe: every forward)
        add_step(l, -1, -1, 0, 0, i, -1);     //   recv_forward
        add_step(l, i, -1, 1, 0, -1, -1);     //   forward, send_forward
    }
    if (steady > 0) { add_step(l, -1, -1, 0, 0, warm, -1); }
    for (int k = 0; k < steady; k++) {        // steady state: forward i = warm + k, backward k
        int i = warm + k;
        add_step(l, i, -1, 1, 0, -1, k);                          // forward, send_forward_recv_backward
        add_step(l, -1, k, 0, 1, k + 1 < steady ? i + 1 : -1, -1);   // backward, send_backward_recv_forward
    }
    for (int k = steady; k < m; k++) {        // cool-down (GPipe: every backward)
        add_step(l, -1, -1, 0, 0, -1, k);     //   recv_backward
        add_step(l, -1, k, 0, 1, -1, -1);     //   backward, send_backward
    }
}

// ZB-H1: 1F1B's steps with each backward's W pass moved into a later exchange (its wait). w counts the W
// passes run; after B k, k + 1 - w are pending, and stage s runs one in that B's exchange (while the next
// input is on its way) only if more than s are; in the cool-down it runs one in every exchange that waits
// for a gradient, then the rest.
static void steps_zb(StepList *l, int m) {
    int pp = l->pp, s = l->rank;
    int warm = pp - s - 1 < m ? pp - s - 1 : m, steady = m - warm, w = 0;
    for (int i = 0; i < warm; i++) {
        add_step(l, -1, -1, 0, 0, i, -1);
        add_step(l, i, -1, 1, 0, -1, -1);
    }
    if (steady > 0) { add_step(l, -1, -1, 0, 0, warm, -1); }
    for (int k = 0; k < steady; k++) {
        int i = warm + k, next = k + 1 < steady ? i + 1 : -1;
        add_step(l, i, -1, 1, 0, -1, k);                               // forward, send_forward_recv_backward
        add_step_w(l, -1, k, 0, 1, next, -1, k + 1 - w > s ? w++ : -1);   // B, send_backward_recv_forward (+ W)
    }
    for (int k = steady; k < m; k++) {
        add_step_w(l, -1, -1, 0, 0, -1, k, w < k ? w++ : -1);   // recv_backward (+ W)
        add_step(l, -1, k, 0, 1, -1, -1);                        // B, send_backward
    }
    while (w < m) { add_step_w(l, -1, -1, 0, 0, -1, -1, w++); }   // the W passes left
}

// The first forward >= k whose input comes from another rank (not chunk 0 of rank 0), and the first
// backward >= k whose output's gradient does (not the last chunk of rank pp-1); m*vpp if none.
static int next_input(const StepList *l, int k) {
    while (k < l->n_total && l->rank == 0 && schedule_chunk(k, l->pp, l->vpp, 1) == 0) { k++; }
    return k;
}
static int next_gradient(const StepList *l, int k) {
    while (k < l->n_total && l->rank == l->pp - 1 && schedule_chunk(k, l->pp, l->vpp, 0) == l->vpp - 1) { k++; }
    return k;
}

// Interleaved 1F1B (Megatron's schedule): warm-up forwards, then steps of one forward and one
// backward with a single exchange in both directions, then the cool-down backwards. Rank r's warm-up
// is 2(pp-r-1) + (vpp-1)pp forwards (all of them when m == pp). What a rank receives in an exchange is
// what its neighbour sends in the matching one: each rank's k-th output goes to the next rank's k-th
// input that comes from a peer, in order (send and receive sequences are the same, in the same order,
// because every rank runs the chunks in the same order); the receives below follow the senders.
static void steps_interleaved(StepList *l, int m) {
    int pp = l->pp, vpp = l->vpp, r = l->rank, total = m * vpp;
    int all_warm = m == pp;
    int warm = all_warm ? total : 2 * (pp - r - 1) + (vpp - 1) * pp;
    if (warm > total) { warm = total; }
    int rest = total - warm;
    // the inputs and the gradients this rank receives, in order: forwards / backwards not fed by itself
    int next_in = 0, next_grad = 0;
    #define NEXT_IN() (next_in = next_input(l, next_in), next_in < total ? next_in++ : -1)
    #define NEXT_GRAD() (next_grad = next_gradient(l, next_grad), next_grad < total ? next_grad++ : -1)
    add_step(l, -1, -1, 0, 0, r != 0 ? NEXT_IN() : -1, -1);   // forward 0's input (rank 0: the embedding makes it)
    for (int k = 0; k < warm; k++) {
        // the previous rank sends the output of its forward k; rank 0 gets rank pp-1's (the next chunk's input)
        int recv = k + 1 < total && !(r == 0 && schedule_chunk(k + 1, pp, vpp, 1) == 0);
        int grad = k == warm - 1 && !all_warm && r != pp - 1;   // the last warm-up step: the first gradient too
        add_step(l, k, -1, 1, 0, recv ? NEXT_IN() : -1, grad ? NEXT_GRAD() : -1);
    }
    for (int j = 0; j < rest; j++) {
        int kf = warm + j, kb = j;
        // rank 0 is pp-1 forwards ahead of rank pp-1, which sends nothing after its last chunk; likewise
        // rank pp-1 is ahead of rank 0 in the backward, which sends nothing from its chunk 0
        int recv = j < rest - 1 && !(r == 0 && schedule_chunk(kf - (pp - 1), pp, vpp, 1) == vpp - 1);
        int grad = !(r == pp - 1 && schedule_chunk(kb - (pp - 1), pp, vpp, 0) == 0);
        add_step(l, kf, kb, 1, 1, recv ? NEXT_IN() : -1, grad ? NEXT_GRAD() : -1);
    }
    if (all_warm && r != pp - 1) { add_step(l, -1, -1, 0, 0, -1, NEXT_GRAD()); }
    for (int k = rest; k < total; k++) {
        int grad = k + 1 < total && !(r == pp - 1 && schedule_chunk(k + 1, pp, vpp, 0) == vpp - 1);
        add_step(l, -1, k, 0, 1, -1, grad ? NEXT_GRAD() : -1);
    }
    #undef NEXT_IN
    #undef NEXT_GRAD
}

// Rank `rank`'s schedule for m micro-batches (forward_only: one micro-batch through every chunk).
static StepList pipeline_steps(PipeSchedule schedule, int pp, int vpp, int rank, int m, int forward_only) {
    StepList l = {NULL, 0, 0, pp, vpp, rank, m * vpp};
    if (forward_only) {   // micro-batch 0 around the ranks vpp times: forward k = v*pp is chunk v
        for (int v = 0; v < vpp; v++) {
            add_step(&l, -1, -1, 0, 0, v * pp, -1);
            add_step(&l, v * pp, -1, 1, 0, -1, -1);
        }
    } else if (schedule == SCHEDULE_INTERLEAVED) {
        steps_interleaved(&l, m);
    } else if (schedule == SCHEDULE_ZB) {
        steps_zb(&l, m);
    } else {
        steps_1f1b(&l, m, schedule == SCHEDULE_GPIPE);
    }
    return l;
}

// One message of an exchange: sent (1) or received (0), an activation (grad 0: forward k's output) or a
// gradient (grad 1: backward k's input gradient), and the peer. A step's messages in the order pipe_exchange
// posts them (comm_p2p then posts its receives first, then its sends, each kind of post in this order).
typedef struct { int send, grad, k, peer; } PipeMsg;
static int pipe_step_messages(const PipeStep *st, int pp, int rank, PipeMsg out[4]) {
    int next = (rank + 1) % pp, prev = (rank + pp - 1) % pp, n = 0;
    if (st->send_fwd) { out[n++] = (PipeMsg){1, 0, st->fwd, next}; }
    if (st->send_bwd) { out[n++] = (PipeMsg){1, 1, st->bwd, prev}; }
    if (st->recv_fwd >= 0) { out[n++] = (PipeMsg){0, 0, st->recv_fwd, prev}; }
    if (st->recv_bwd >= 0) { out[n++] = (PipeMsg){0, 1, st->recv_bwd, next}; }
    return n;
}

// Messages between two ranks carry no tag: the i-th message rank a posts to rank b is the i-th that b posts
// to receive from a, whatever its kind (comm.h). So a's sends to b, in posting order over the whole step, must
// be b's receives from a, in order: the same kind, the same micro-batch, and the chunk that follows (an
// activation crossing from rank pp-1 to rank 0 enters the next chunk; a gradient crossing back, the one
// before). With pp 2 both kinds go each way, so this also fixes the order between them. Returns 0 if not.
static int steps_match(const StepList *a, const StepList *b) {
    int pp = a->pp, vpp = a->vpp, ns = 0, nr = 0, ok = 1;
    PipeMsg *sent = (PipeMsg *)malloc_check(sizeof(PipeMsg) * (4 * (size_t)(a->n + b->n) + 1)), *got = sent + 4 * a->n;
    PipeMsg msg[4];
    for (int i = 0; i < a->n; i++) {
        int n = pipe_step_messages(&a->s[i], pp, a->rank, msg);
        for (int j = 0; j < n; j++) { if (msg[j].send && msg[j].peer == b->rank) { sent[ns++] = msg[j]; } }
    }
    for (int i = 0; i < b->n; i++) {
        int n = pipe_step_messages(&b->s[i], pp, b->rank, msg);
        for (int j = 0; j < n; j++) { if (!msg[j].send && msg[j].peer == a->rank) { got[nr++] = msg[j]; } }
    }
    ok = ns == nr;
    for (int i = 0; ok && i < ns; i++) {
        const PipeMsg *x = &sent[i], *y = &got[i];
        int fwd = !x->grad, wrap = fwd ? a->rank == pp - 1 : a->rank == 0;
        ok = x->grad == y->grad && schedule_micro(x->k, pp, vpp) == schedule_micro(y->k, pp, vpp) &&
             schedule_chunk(x->k, pp, vpp, fwd) + (fwd ? wrap : -wrap) == schedule_chunk(y->k, pp, vpp, fwd);
    }
    free(sent);
    return ok;
}

typedef struct {
    Group *pp, *tp;
    int first, last;       // this rank holds the first / the last stage (its chunk 0 / chunk vpp-1)
    int split;             // no SP and tp > 1: send 1/tp of each tensor, all-gather on arrival
    size_t n;              // elements of one boundary tensor (B*T/tp_sp * C)
    PipeSchedule schedule;
    int vpp;                 // model chunks per rank (interleaved; 1 otherwise)
    StepList steps;        // this rank's schedule for a training step
    int micro;             // micro-batches per step (the plan's)
    int nslots;            // activation slots: as many (micro-batch, chunk) pairs as are alive at once
    int npending;          // ZB: the most W passes pending at once (micro-batch i's W state: i % npending)
    int *slot_of;          // (vpp, m) the slot of micro-batch i in chunk v while it is alive, -1 otherwise
    int *busy;             // (nslots) 1 while a slot is taken
    int alive, peak;       // slots taken now, and the most at once since the plan
    // (nslots) each slot's residual stream: the chunk's input (received, or made by the embedding),
    floatX **resid;
                           // each layer's output, the last one the chunk's output (sent, or taken by the head)
    int *chunk_len;        // (vpp) layers of each chunk: its output is resid + chunk_len * n
    floatX *grad;          // the gradient of the output (received), then of the input (sent): ws.dresid
    floatX *grad_recv;     // interleaved: where a received gradient waits for its backward (1F1B: grad)
    int grad_held;         // the backward whose gradient is in grad_recv (-1: none)
    double wait_seconds;   // time in the exchanges: the bubble (when time_waits)
    int time_waits;        // measure it (--comm-report, --trace): the device synchronised around the exchanges
    int overlap;           // sends do not block: they complete while the stage computes (--overlap)
    floatX *grad_send;     // a copy of the gradient being sent (grad is written by the next backward)
    floatX *input;         // ZB: where a received input waits for its forward (which takes its slot then)
    int input_held;        // the forward whose input is in input (-1: none)
    CommRequest sending[2];   // overlap: the sends in flight, completed at the next exchange
} Pipeline;

// The slot of forward (or backward) k's micro-batch in its chunk.
static int pipe_slot(const Pipeline *p, int k, int forward) {
    int pp = p->pp->size, v = schedule_chunk(k, pp, p->vpp, forward), i = schedule_micro(k, pp, p->vpp),
        s = p->slot_of[v * p->micro + i];
    if (s < 0) { fail("pipeline: micro-batch %d of chunk %d has no activation slot: a bug", i, v); }
    return s;
}

// The activation slots, one pool for all the stage's chunks: a (micro-batch, chunk) takes the lowest
// free slot when its input arrives (or its forward starts, on chunk 0 of the first stage) and gives it
// back after its backward. The plan runs the schedule's list through the same rules to size the pool.
static void slot_take(Pipeline *p, int k) {
    int pp = p->pp->size, v = schedule_chunk(k, pp, p->vpp, 1), i = schedule_micro(k, pp, p->vpp), s = 0;
    while (s < p->nslots && p->busy[s]) { s++; }
    if (s == p->nslots || p->slot_of[v * p->micro + i] >= 0) {
        fail("pipeline: no free activation slot for micro-batch %d of chunk %d (%d slots): a bug", i, v, p->nslots);
    }
    p->busy[s] = 1;
    p->slot_of[v * p->micro + i] = s;
    if (++p->alive > p->peak) { p->peak = p->alive; }
}
static void slot_give(Pipeline *p, int k) {
    int pp = p->pp->size, v = schedule_chunk(k, pp, p->vpp, 0), i = schedule_micro(k, pp, p->vpp);
    p->busy[pipe_slot(p, k, 0)] = 0;
    p->slot_of[v * p->micro + i] = -1;
    p->alive--;
}
static void slots_reset(Pipeline *p) {
    p->input_held = -1;
    for (int i = 0; i < p->vpp * p->micro; i++) { p->slot_of[i] = -1; }
    for (int s = 0; s < p->nslots; s++) { p->busy[s] = 0; }
    p->alive = 0;
}

// The schedule of rank `rank` for m micro-batches, checked against its neighbours', and the number of
// activation slots it needs: the most (micro-batch, chunk) pairs alive at once, each alive from its
// input's arrival (or its forward, on chunk 0 of the first stage) to the end of its backward (ZB: of its
// W pass, which runs after the step's receives are posted); and (ZB) the most W passes pending at once.
static int pipeline_plan(Pipeline *p, PipeSchedule schedule, int pp, int vpp, int rank, int m) {
    p->schedule = schedule;
    p->vpp = vpp;
    p->steps = pipeline_steps(schedule, pp, vpp, rank, m, 0);
    StepList prev = pipeline_steps(schedule, pp, vpp, (rank + pp - 1) % pp, m, 0);
    StepList next = pipeline_steps(schedule, pp, vpp, (rank + 1) % pp, m, 0);
    if (pp > 1 && (!steps_match(&p->steps, &next) || !steps_match(&next, &p->steps) || !steps_match(&prev, &p->steps) ||
                   !steps_match(&p->steps, &prev))) {
        fail("the %s schedule's exchanges do not pair up (pp %d, vpp %d, m %d): a bug",
             schedule == SCHEDULE_INTERLEAVED ? "interleaved" : schedule == SCHEDULE_ZB ? "ZB-H1" : "pipeline",
             pp, vpp, m);
    }
    free(prev.s); free(next.s);
    int alive = 0, most = pp == 1 ? 1 : 0;   // (no pipeline: forward, backward, forward, ...)
    int zb = schedule == SCHEDULE_ZB, pending = 0;   // (ZB: a slot is taken at the forward, the input waits in p->input)
    p->npending = 0;
    for (int i = 0; i < p->steps.n; i++) {
        const PipeStep *s = &p->steps.s[i];
        if (s->fwd >= 0 && ((rank == 0 && schedule_chunk(s->fwd, pp, vpp, 1) == 0) || zb)) { alive++; }
        if (alive > most) { most = alive; }
        if (s->bwd >= 0 && zb && ++pending > p->npending) { p->npending = pending; }
        if (s->bwd >= 0 && !zb) { alive--; }
        if (s->recv_fwd >= 0 && !zb) { alive++; }
        if (alive > most) { most = alive; }
        if (s->wgt >= 0) { alive--; pending--; }
    }
    p->micro = m;
    p->nslots = most;
    p->slot_of = (int *)malloc_check(vpp * (size_t)m * sizeof(int));
    p->busy = (int *)malloc_check(most * sizeof(int));
    slots_reset(p);
    p->peak = 0;
    return most;
}

// The exchanges' buffers, once the slots are planned: resid (nslots) each slot's residual stream and
// chunk_len (vpp) each chunk's layers (both taken over: pipeline_free frees them), grad the model's
// gradient buffer; the pipeline's own: interleaved, where a received gradient waits for its backward (a
// gradient can arrive while another chunk's backward, the head's, still uses grad); with overlap (sends
// that complete while the stage computes), the copy of the gradient being sent.
static void pipeline_alloc(Pipeline *p, int first, int last, int split, size_t n, floatX **resid, int *chunk_len,
                           floatX *grad, int overlap) {
    p->first = first; p->last = last;
    p->split = split;
    p->n = n;
    p->resid = resid;
    p->chunk_len = chunk_len;
    p->grad = grad;
    p->grad_recv = p->vpp > 1 ? (floatX *)mem_alloc(n * floatx_bytes(), MEM_COMM) : grad;
    p->grad_held = -1;
    p->overlap = overlap;
    p->grad_send = overlap && (!first || p->vpp > 1) ? (floatX *)mem_alloc(n * floatx_bytes(), MEM_COMM) : NULL;
    p->input = p->schedule == SCHEDULE_ZB && !first ? (floatX *)mem_alloc(n * floatx_bytes(), MEM_COMM) : NULL;
    p->input_held = -1;
}

// The pipeline's host memory (its device buffers are the allocator's: alloc.h).
static void pipeline_free(Pipeline *p) {
    free(p->steps.s); free(p->slot_of); free(p->busy); free(p->resid); free(p->chunk_len);
    memset(p, 0, sizeof(*p));
}

// The work of one stage, called by the schedule: the forward of micro-batch i through model chunk v
// (its input received; the last chunk of the last stage also runs the head and the loss, forward and
// backward), and the backward of micro-batch i through chunk v (the gradient of its output in
// p->grad; it leaves the gradient of its input there; ZB: B only), and (ZB) the W pass of micro-batch i
// through chunk v (the gradients of its weights; its B ran before).
typedef struct {
    void *ctx;
    void (*forward)(void *ctx, int v, int i);
    void (*backward)(void *ctx, int v, int i);
    void (*weights)(void *ctx, int v, int i);
} StageWork;

// ZB: the W pass of backward k, then its activation slot is free.
static void pipe_weights(Pipeline *p, int k, StageWork w) {
    if (k < 0) { return; }
    int pp = p->pp->size;
    w.weights(w.ctx, schedule_chunk(k, pp, p->vpp, 0), schedule_micro(k, pp, p->vpp));
    slot_give(p, k);
}



// Where message m of step st is sent from or received into (this rank's slice: k elements at off of the buffer);
// got[0], got[1]: set to the buffer of a received activation, a received gradient.
static floatX *pipe_message_buffer(Pipeline *p, const PipeStep *st, const PipeMsg *m, floatX *got[2], size_t off,
                                   size_t k) {
    int pp = p->pp->size;
    floatX *buf;
    if (m->send && !m->grad) {          // forward k's output
        buf = p->resid[pipe_slot(p, st->fwd, 1)] + (size_t)p->chunk_len[schedule_chunk(st->fwd, pp, p->vpp, 1)] * p->n;
    } else if (m->send) {               // the gradient of backward k's input
        buf = p->grad;
        if (p->grad_send) {   // the next backward writes grad while this is in flight
            copy_on_device(p->grad_send + off, buf + off, k * sizeof(floatX));
            buf = p->grad_send;
        }
    } else if (!m->grad && p->input) {  // ZB: forward k's input, to wait for its forward
        if (p->input_held >= 0) { fail("pipeline: input %d arrived over input %d: a bug", st->recv_fwd, p->input_held); }
        buf = got[0] = p->input;
        p->input_held = st->recv_fwd;
    } else if (!m->grad) {              // forward k's input, into a slot of its own
        slot_take(p, st->recv_fwd);
        buf = got[0] = p->resid[pipe_slot(p, st->recv_fwd, 1)];
    } else {                            // backward k's output gradient
        buf = got[1] = p->grad_recv;
        p->grad_held = st->recv_bwd;
    }
    return buf;
}

// One exchange with the neighbours (the step's sends and receives, all started together). The next
// stage of chunk v is the next rank's chunk v, but after rank pp-1: rank 0's chunk v+1 (interleaved).
// ZB: the step's W pass runs while the messages are in flight (the time it takes is not counted as waiting).
static void pipe_exchange(Pipeline *p, const PipeStep *st, StageWork w) {
    int pp = p->pp->size;
    if (pp == 1 || (!st->send_fwd && !st->send_bwd && st->recv_fwd < 0 && st->recv_bwd < 0)) {
        pipe_weights(p, st->wgt, w);
        return;
    }
    char name[96];
    snprintf(name, sizeof(name), "%s%s%s%s", st->send_fwd ? "send_forward " : "", st->send_bwd ? "send_backward " : "",
             st->recv_fwd >= 0 ? "recv_forward " : "", st->recv_bwd >= 0 ? "recv_backward " : "");
    name[strlen(name) - 1] = 0;
    for (char *c = name; *c; c++) { if (*c == ' ') { *c = '+'; } }
    #define EXCHANGE_TRACE_END() trace_end(name, "pipeline", \
        "\"send_forward\":%d,\"recv_forward\":%d,\"send_backward\":%d,\"recv_backward\":%d", \
        st->send_fwd ? st->fwd : -1, st->recv_fwd, st->send_bwd ? st->bwd : -1, st->recv_bwd)
    trace_begin();
    // this rank's slice
    size_t k = p->split ? p->n / p->tp->size : p->n, off = p->split ? (size_t)p->tp->rank * k : 0;
    if (p->time_waits) { device_synchronize(); }   // the compute before is not waiting
    double t0 = monotonic_seconds();
    for (int i = 0; i < 2; i++) { comm_wait(&p->sending[i]); }   // the previous exchange's sends
    PipeMsg msg[4];
    P2POp ops[4];
    int n = pipe_step_messages(st, pp, p->pp->rank, msg);   // (the order steps_match checked at set-up)
    floatX *got[2] = {NULL, NULL};
    for (int j = 0; j < n; j++) {
        floatX *buf = pipe_message_buffer(p, st, &msg[j], got, off, k);
        // (kind: the micro-batch and activation or gradient: what the two ranks must agree the message is)
        ops[j] = (P2POp){msg[j].send, buf + off, k, msg[j].peer, 1 + msg[j].grad + 2 * schedule_micro(msg[j].k, pp, p->vpp)};
    }
    CommRequest sends[2] = {}, recvs[2] = {};   // ZB: in flight while W runs
    int wgt = st->wgt >= 0;
    comm_p2p(p->pp, ops, n, DT_FLOATX, p->overlap ? p->sending : wgt ? sends : NULL, wgt ? recvs : NULL);
    if (wgt) {   // (what the receives write and the sends read, W does not touch: p->grad, the slots' resid)
        p->wait_seconds += monotonic_seconds() - t0;
        EXCHANGE_TRACE_END();
        pipe_weights(p, st->wgt, w);
        trace_begin();
        if (p->time_waits) { device_synchronize(); }
        t0 = monotonic_seconds();
        for (int i = 0; i < 2; i++) { comm_wait(&recvs[i]); comm_wait(&sends[i]); }
    }
    for (int i = 0; i < 2; i++) {
        if (p->split && got[i]) { comm_all_gather(p->tp, got[i] + off, got[i], k, DT_FLOATX, NULL); }
    }
    if (p->time_waits) { device_synchronize(); }
    p->wait_seconds += monotonic_seconds() - t0;
    EXCHANGE_TRACE_END();
    #undef EXCHANGE_TRACE_END
}

static void pipeline_execute(Pipeline *p, const StepList *l, StageWork w) {
    int pp = p->pp->size, vpp = p->vpp;
    for (int i = 0; i < l->n; i++) {
        const PipeStep *s = &l->s[i];
        if (s->fwd >= 0) {
            int v = schedule_chunk(s->fwd, pp, vpp, 1);
            if (p->first && v == 0) { slot_take(p, s->fwd); }   // (the others took theirs when the input arrived,
            else if (p->input) {                                // but ZB's: now, from where the input waited)
                if (p->input_held != s->fwd) { fail("pipeline: forward %d ran without its input: a bug", s->fwd); }
                slot_take(p, s->fwd);
                copy_on_device(p->resid[pipe_slot(p, s->fwd, 1)], p->input, p->n * sizeof(floatX));
                p->input_held = -1;
            }
            w.forward(w.ctx, v, schedule_micro(s->fwd, pp, vpp));
        }
        if (s->bwd >= 0) {
            int v = schedule_chunk(s->bwd, pp, vpp, 0);
            if (!(p->last && v == vpp - 1) && p->grad_recv != p->grad) {   // its gradient waited in grad_recv
                if (p->grad_held != s->bwd) { fail("pipeline: backward %d ran without its gradient: a bug", s->bwd); }
                copy_on_device(p->grad, p->grad_recv, p->n * sizeof(floatX));
                p->grad_held = -1;
            }
            w.backward(w.ctx, v, schedule_micro(s->bwd, pp, vpp));
            if (p->schedule != SCHEDULE_ZB) { slot_give(p, s->bwd); }   // (ZB: after its W)
        }
        pipe_exchange(p, s, w);
    }
}

// A training step: the m micro-batches this plan was made for, through this stage, as the schedule
// orders them; then the flush.
static void pipeline_run(Pipeline *p, StageWork w) {
    slots_reset(p);
    pipeline_execute(p, &p->steps, w);
    if (p->pp->size > 1) {   // the later stages finish their last backward first: that wait is bubble too
        trace_begin();
        if (p->time_waits) { device_synchronize(); }
        double t0 = monotonic_seconds();
        for (int i = 0; i < 2; i++) { comm_wait(&p->sending[i]); }
        if (p->time_waits) { comm_host_barrier(p->pp, "pipeline flush barrier"); }
        p->wait_seconds += monotonic_seconds() - t0;
        trace_end("flush", "pipeline", NULL);
    }
}

// One micro-batch forward through every stage (validation, sampling).
static void pipeline_forward_only(Pipeline *p, StageWork w) {
    StepList l = pipeline_steps(p->schedule, p->pp->size, p->vpp, p->pp->rank, 1, 1);
    slots_reset(p);   // (no backward gives them back: they stay, for the caller to read the output, until the next run)
    pipeline_execute(p, &l, w);
    for (int i = 0; i < 2; i++) { comm_wait(&p->sending[i]); }
    free(l.s);
}

#endif
