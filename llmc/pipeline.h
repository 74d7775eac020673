// Pipeline parallelism, in one place: how the layers are cut into stages, the schedules (1F1B and
// GPipe) and the point-to-point exchanges between neighbouring stages.
//
// The L layers are cut into pp stages of contiguous layers (stage_layers); the first stage also runs
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
// The exchanges are named after what they move (Megatron's names): send_forward / recv_forward move
// activations to the next stage, send_backward / recv_backward move gradients to the previous one, and
// the steady state combines a send with a receive in one step so that neighbours never wait on each
// other's sends. Without SP every tp rank holds the same (B*T, C) boundary tensor: each sends only its
// 1/tp slice and the receivers all-gather it over tp (Megatron's scatter-gather), so the link between
// stages carries it once, not tp times. With --overlap the sends do not block: a stage goes on with its
// next forward or backward while its output (or its input's gradient, copied aside) is in flight, and
// waits for them at its next exchange. Time spent in the exchanges is the bubble (wait_seconds).
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <time.h>
#include "comm.h"

typedef enum { SCHEDULE_1F1B, SCHEDULE_GPIPE } PipeSchedule;

static double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// The layers [l0, l1) of stage `stage` of pp: an even split, the first L % pp stages one more.
static void stage_layers(int L, int pp, int stage, int *l0, int *l1) {
    int base = L / pp, extra = L % pp;
    *l0 = stage * base + (stage < extra ? stage : extra);
    *l1 = *l0 + base + (stage < extra ? 1 : 0);
}

// Micro-batches whose activations are alive at once on a stage (and so the activation slots it needs).
// Without a pipeline both schedules are forward, backward, forward, ... : one.
static int pipeline_slots(PipeSchedule schedule, int pp, int stage, int m) {
    int alive = pp == 1 ? 1 : (schedule == SCHEDULE_GPIPE ? m : pp - stage);
    return alive < m ? alive : m;
}

typedef struct {
    Group *pp, *tp;
    int first, last;       // this stage is the first / the last
    int split;             // no SP and tp > 1: send 1/tp of each tensor, all-gather on arrival
    size_t n;              // elements of one boundary tensor (B*T/tp_sp * C)
    PipeSchedule schedule;
    int nslots;            // activation slots: micro-batch i lives in slot i % nslots
    floatX **input;        // (nslots) the stage's input of each slot (received)
    floatX **output;       // (nslots) the stage's output of each slot (sent)
    floatX *grad;          // the gradient of the output (received), then of the input (sent)
    double wait_seconds;   // time in the exchanges: the bubble
    int overlap;           // sends do not block: they complete while the stage computes (--overlap)
    floatX *grad_send;     // overlap: the gradient being sent (a copy: grad is written by the next backward)
    CommRequest sending[2];   // overlap: the sends in flight (forward, backward), completed at the next exchange
} Pipeline;

// One exchange with the neighbours: the output of micro-batch send_fwd to the next stage and/or the
// gradient of the input to the previous one (send_bwd), while receiving micro-batch recv_fwd's input
// from the previous stage and/or the gradient of the output from the next one (recv_bwd). 0 / -1
// leave a part out. The named exchanges below are the only callers.
static void pipe_exchange(Pipeline *p, const char *name, int send_fwd, int recv_bwd, int send_bwd, int recv_fwd) {
    if (p->first && p->last) { return; }   // no pipeline
    trace_begin();
    size_t k = p->split ? p->n / p->tp->size : p->n, off = p->split ? (size_t)p->tp->rank * k : 0;   // this rank's slice
    int prev = p->pp->rank - 1, next = p->pp->rank + 1;
    device_synchronize();                  // the compute before is not waiting
    double t0 = wall_seconds();
    for (int i = 0; i < 2; i++) { comm_wait(&p->sending[i]); }   // the previous exchange's sends
    floatX *got_fwd = NULL, *got_bwd = NULL;
    if (!p->last && (send_fwd >= 0 || recv_bwd)) {
        floatX *out = send_fwd >= 0 ? p->output[send_fwd % p->nslots] : NULL;
        if (p->overlap && out) {   // the output slot is not written before this micro-batch's backward
            comm_isend(p->pp, out + off, k, DT_FLOATX, next, &p->sending[0]);
            out = NULL;
        }
        comm_sendrecv(p->pp, out ? out + off : NULL, out ? k : 0, next, p->grad + off, recv_bwd ? k : 0, next, DT_FLOATX);
        if (recv_bwd) { got_bwd = p->grad; }
    }
    if (!p->first && (send_bwd || recv_fwd >= 0)) {
        floatX *in = recv_fwd >= 0 ? p->input[recv_fwd % p->nslots] : NULL, *g = send_bwd ? p->grad + off : NULL;
        if (p->overlap && g) {
            copy_on_device(p->grad_send + off, g, k * sizeof(floatX));
            comm_isend(p->pp, p->grad_send + off, k, DT_FLOATX, prev, &p->sending[1]);
            g = NULL;
        }
        comm_sendrecv(p->pp, g, g ? k : 0, prev, in ? in + off : NULL, in ? k : 0, prev, DT_FLOATX);
        got_fwd = in;
    }
    floatX *got[2] = {got_fwd, got_bwd};
    for (int i = 0; i < 2; i++) {
        if (p->split && got[i]) { comm_all_gather(p->tp, got[i] + off, got[i], k, DT_FLOATX, NULL); }
    }
    device_synchronize();
    p->wait_seconds += wall_seconds() - t0;
    trace_end(name, "pipeline", "\"send_forward\":%d,\"recv_forward\":%d", send_fwd, recv_fwd);
}

static void recv_forward(Pipeline *p, int i) { pipe_exchange(p, "recv_forward", -1, 0, 0, i); }
static void send_forward(Pipeline *p, int i) { pipe_exchange(p, "send_forward", i, 0, 0, -1); }
static void recv_backward(Pipeline *p) { pipe_exchange(p, "recv_backward", -1, 1, 0, -1); }
static void send_backward(Pipeline *p) { pipe_exchange(p, "send_backward", -1, 0, 1, -1); }
static void send_forward_recv_backward(Pipeline *p, int i) { pipe_exchange(p, "send_forward_recv_backward", i, 1, 0, -1); }
// the gradient of the input to the previous stage; the input of micro-batch i (-1: none) from it
static void send_backward_recv_forward(Pipeline *p, int i) { pipe_exchange(p, "send_backward_recv_forward", -1, 0, 1, i); }

// The work of one stage, called by the schedule: the forward of micro-batch i (its input received;
// the last stage also runs the head and the loss, forward and backward), and the backward of
// micro-batch i (the gradient of its output received; it leaves the gradient of its input in p->grad).
typedef struct {
    void *ctx;
    void (*forward)(void *ctx, int i);
    void (*backward)(void *ctx, int i);
} StageWork;

// m micro-batches through this stage, as the schedule orders them. Every stage runs the same
// code; the warm-up length is what differs.
static void pipeline_run(Pipeline *p, int m, StageWork w) {
    int pp = p->pp->size, s = p->pp->rank;
    int warm = p->schedule == SCHEDULE_GPIPE ? m : (pp - s - 1 < m ? pp - s - 1 : m);
    int steady = m - warm;
    for (int i = 0; i < warm; i++) {          // warm-up (GPipe: every forward)
        recv_forward(p, i);
        w.forward(w.ctx, i);
        send_forward(p, i);
    }
    if (steady > 0) { recv_forward(p, warm); }
    for (int k = 0; k < steady; k++) {        // steady state: forward i = warm + k, backward k
        int i = warm + k;
        w.forward(w.ctx, i);
        send_forward_recv_backward(p, i);
        w.backward(w.ctx, k);
        send_backward_recv_forward(p, k + 1 < steady ? i + 1 : -1);
    }
    for (int k = steady; k < m; k++) {        // cool-down (GPipe: every backward)
        recv_backward(p);
        w.backward(w.ctx, k);
        send_backward(p);
    }
    if (pp > 1) {   // the later stages finish their last backward first: that wait is bubble too
        trace_begin();
        device_synchronize();
        double t0 = wall_seconds();
        for (int i = 0; i < 2; i++) { comm_wait(&p->sending[i]); }
        WATCHED("pipeline flush barrier", p->pp->name, MPI_Barrier(p->pp->mpi));
        p->wait_seconds += wall_seconds() - t0;
        trace_end("flush", "pipeline", NULL);
    }
}

// One micro-batch forward through every stage (validation, sampling): its input from the previous
// stage, the stage's layers, the output to the next.
static void pipeline_forward_only(Pipeline *p, StageWork w) {
    recv_forward(p, 0);
    w.forward(w.ctx, 0);
    send_forward(p, 0);
}

#endif
