// The collectives, in one place, over the groups of the process grid (grid.h). Collectives take a Group, so the
// call site says which ranks talk. The CPU build runs the same calls through MPI on host memory.
// Streams (CUDA): every group has a stream of its own, and each NCCL call of the group runs on it, so
// that a blocking tp collective never queues behind an asynchronous dp reduction or a pipeline send.
// The calls of one communicator are issued to its one stream in program order, the same order on every
// rank. Compute runs on main_stream; events order the two (comm_stream_begin / comm_stream_end):
//   main_stream --record g->ready--> g->stream waits: the collective starts once its input is computed
//   g->stream --record done--> main_stream waits: at once (blocking) or at comm_wait (asynchronous)
// Operations of different groups may then run at the same time. NCCL does not promise that two
// communicators progress concurrently; it needs every rank to issue each communicator's operations in
// one order (ours do: the schedule is the same program on every rank) and the compute stream to wait
// for each result before using it (the events above).
// Byte accounting: each collective adds to its group the bytes one rank sends with the ring
// algorithm (all-reduce 2(p-1)/p*N, reduce-scatter and all-gather (p-1)/p*N, N = full size).
// The flight recorder (flight_recorder.h) records every call here as it is posted and as it completes (CPU: when
// the MPI call returns, or at the wait of an asynchronous one; CUDA: an event after the NCCL call, queried later):
// the one record of communication, which the watchdog's diagnosis reads (guard.h, flight_diagnosis.h) and test_gpt
// --check-comm checks (every pair's messages match, every two ranks order their shared collectives alike).
// --check-collectives (comm_check): before each collective its group agrees on the call, or the job stops naming
// both sides.
// Host buffers (the loss, flags, a sampled token, metadata, the checkpoints' arrays) have their own calls,
// comm_host_*: MPI on both backends, of any count (cut into pieces of at most COMM_HOST_CHUNK elements:
// MPI counts are int, and Open MPI 4.1 has no large-count calls); so do the CPU build's MPI calls.
#ifndef LLMC_COMM_H
#define LLMC_COMM_H

#include <limits.h>
#include "backend.h"
#include "grid.h"
#include "trace.h"
#include "guard.h"
#include "test_hooks.h"

// DT_DOUBLE: the step's loss and norm sums; DT_INT: MoE choices
typedef enum { DT_FLOAT, DT_FLOATX, DT_DOUBLE, DT_INT, DT_BYTE } DType;

// The most elements one MPI call moves; larger counts go in pieces (a test build sets a small one).
#ifndef COMM_HOST_CHUNK
#define COMM_HOST_CHUNK ((size_t)1 << 30)
#endif
static size_t comm_piece(size_t n, size_t done) { return n - done < COMM_HOST_CHUNK ? n - done : COMM_HOST_CHUNK; }

static size_t comm_type_size(DType t) {
    return t == DT_FLOAT ? sizeof(float) : t == DT_DOUBLE ? sizeof(double) : t == DT_INT ? sizeof(int) : t == DT_BYTE
            ? 1 : sizeof(floatX);
}

// The MPI datatype of a host DType (DT_FLOATX only on the CPU build, where floatX is float).
static MPI_Datatype mpi_type(DType t) {
    return t == DT_DOUBLE ? MPI_DOUBLE : t == DT_INT ? MPI_INT : t == DT_BYTE ? MPI_BYTE : MPI_FLOAT;
}

#ifdef USE_NCCL
static ncclDataType_t nccl_type(DType t) {
    if (t == DT_FLOAT) { return ncclFloat; }
    if (t == DT_DOUBLE) { return ncclFloat64; }
    if (t == DT_INT) { return ncclInt32; }
    return sizeof(floatX) == 2 ? ncclBfloat16 : ncclFloat;
}
#endif

// ----------------------------------------------------------------------------
// collectives on device buffers (CPU build: host buffers through MPI)

// A request for an asynchronous collective. On CUDA the collective runs on its group's stream and the
// event marks its end; on the CPU it is a non-blocking MPI request (plus, for an in-place
// reduce-scatter, the copy of the rank's chunk to its place once the request is done).
typedef struct {
#ifdef USE_NCCL
    cudaEvent_t done;
#else
    MPI_Request req;
    void *move_dst;
    const void *move_src;
    size_t move_bytes;
#endif
    int active;
    const char *group;   // (for the watchdog's message)
    Group *g;            // (its wait is exposed time of this group)
    uint64_t flight;     // CPU: its record in the flight recorder, complete at its wait
} CommRequest;

static void comm_count(Group *g, double bytes) { g->bytes += bytes; g->calls++; }
static void comm_mark(CommRequest *async, Group *g) { if (async) { async->group = g->name; async->g = g; } }

// --trace: each collective is a span (trace.h) named by its operation, with its group and bytes
// (CUDA: the span ends on the group's stream, where the call ran: trace.h)
#ifdef USE_NCCL
#define COMM_TRACE_STREAM(g) trace_stream_next((g)->stream, (g)->name)
#else
#define COMM_TRACE_STREAM(g) ((void)0)
#endif
#define COMM_TRACE_END(op, g, bytes, async) do { COMM_TRACE_STREAM(g); \
    trace_end(op, "comm", "\"group\":\"%s\",\"bytes\":%.0f,\"async\":%d", (g)->name, (double)(bytes), (async) != NULL); } while (0)
// --timeout: each blocking op is watched (guard.h) from its start to its end; on the CPU build the time between
// is the group's exposed communication (the MPI call blocks the rank; CUDA's calls only enqueue: not counted)
static double comm_t0;
#define COMM_WATCH(op, g) do { watch_enter(op, (g)->name); comm_t0 = monotonic_seconds(); } while (0)
static void comm_leave(Group *g) {
#ifndef USE_NCCL
    if (g) { g->exposed += monotonic_seconds() - comm_t0; }
#else
    (void)g;
#endif
    watch_leave();
}

// ----------------------------------------------------------------------------
// the record of each call (flight_recorder.h), and --check-collectives

static int comm_check_collectives = 0;   // --check-collectives
static void comm_check(Group *g, int op, size_t n, DType t, uint32_t seq);

// A call on group g posted: its record (a collective: peer -1; a message: to or from group rank peer, tag its kind),
// checked against the group's other members first under --check-collectives. Returns the record's id.
static uint64_t comm_record(Group *g, int op, int peer, size_t n, DType t, int tag) {
    flight_poll();   // (CUDA: the device calls complete since; CPU: nothing)
    uint64_t id = flight_post(g->flight, op, peer, n, (int)t, (int)comm_type_size(t), tag);
    if (comm_check_collectives && !flight_is_message(op) && g->flight) {
        comm_check(g, op, n, t, flight_header()->groups[g->flight - 1].posted);
    }
    return id;
}

// The call of record id is posted: complete now (CPU, blocking), at its wait (CPU, async: the request holds it), or
// when the device reaches the end of the group's stream (CUDA).
static void comm_posted(Group *g, uint64_t id, CommRequest *async) {
#ifdef USE_NCCL
    (void)async;
    flight_done_on_stream(id, g->stream);
#else
    (void)g;
    if (async && async->active) { async->flight = id; flight_async(id); }
    else { flight_done(id); }
#endif
}

#ifdef USE_NCCL
// A call on group g starts on g->stream once the compute stream has produced its input. A blocking
// call makes the compute stream wait for it at once; an async one records an event, and comm_wait
// makes the compute stream wait later.
static cudaStream_t comm_stream_begin(Group *g) {
    cudaCheck(cudaEventRecord(g->ready, main_stream));
    cudaCheck(cudaStreamWaitEvent(g->stream, g->ready, 0));
    return g->stream;
}

static void comm_stream_end(Group *g, CommRequest *async) {
    cudaEvent_t done;
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(done, g->stream));
    if (async) { async->done = done; async->active = 1; return; }
    cudaCheck(cudaStreamWaitEvent(main_stream, done, 0));
    cudaCheck(cudaEventDestroy(done));
}
#else
// The CPU build's collectives of more than COMM_HOST_CHUNK elements, in pieces, blocking (an asynchronous
// one runs blocking: the same result, only sooner).
static void mpi_all_reduce(Group *g, void *buf, size_t n, DType t) {
    size_t es = comm_type_size(t);
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        MPI_Allreduce(MPI_IN_PLACE, (char *)buf + o * es, (int)c, mpi_type(t), MPI_SUM, g->mpi);
    }
}

// send (size, n) -> recv (n): piece [o, o + c) of every rank's block gathered into one buffer, reduced.
static void mpi_reduce_scatter(Group *g, const void *send, void *recv, size_t n, DType t) {
    size_t es = comm_type_size(t), p = g->size;
    char *tmp = (char *)malloc_check(p * COMM_HOST_CHUNK * es);
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        for (size_t r = 0; r < p; r++) { memcpy(tmp + r * c * es, (const char *)send + (r * n + o) * es, c * es); }
        MPI_Reduce_scatter_block(MPI_IN_PLACE, tmp, (int)c, mpi_type(t), MPI_SUM, g->mpi);
        memcpy((char *)recv + o * es, tmp, c * es);
    }
    free(tmp);
}

// send (n) of every rank -> recv (size, n): piece [o, o + c) of each rank's block at a time.
static void mpi_all_gather(Group *g, const void *send, void *recv, size_t n, DType t) {
    size_t es = comm_type_size(t), p = g->size;
    char *tmp = (char *)malloc_check(p * COMM_HOST_CHUNK * es);
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        MPI_Allgather((const char *)send + o * es, (int)c, mpi_type(t), tmp, (int)c, mpi_type(t), g->mpi);
        for (size_t r = 0; r < p; r++) { memcpy((char *)recv + (r * n + o) * es, tmp + r * c * es, c * es); }
    }
    free(tmp);
}
#endif

// NCCL's in-place rules, asserted on both backends (MPI would accept what NCCL computes wrongly): a send and a
// receive buffer of a collective are apart, or the call is in place exactly: reduce-scatter's recv (n) is chunk
// `rank` of send (size n), all-gather's send (n) is chunk `rank` of recv (size n); an all-to-all's are apart.
// NULL when the layout is allowed, else what is wrong.
static int comm_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const char *x = (const char *)a, *y = (const char *)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}
typedef enum { CHUNK_IN_WHOLE_RECV, CHUNK_IN_WHOLE_SEND, APART } InPlaceRule;
static const char *comm_in_place_error(InPlaceRule rule, const void *send, size_t send_bytes, const void *recv,
                                       size_t recv_bytes, int rank) {
    if (!comm_overlap(send, send_bytes, recv, recv_bytes)) { return NULL; }
    if (rule == CHUNK_IN_WHOLE_SEND && (const char *)recv == (const char *)send + (size_t)rank * recv_bytes) { return NULL; }
    if (rule == CHUNK_IN_WHOLE_RECV && (const char *)send == (const char *)recv + (size_t)rank * send_bytes) { return NULL; }
    return rule == APART ? "its send and receive buffers overlap (NCCL has no in-place all-to-all)"
                         : "its send and receive buffers overlap without being in place (the rank's own chunk)";
}
static void comm_check_in_place(Group *g, const char *what, InPlaceRule rule, const void *send, size_t send_bytes,
                                const void *recv, size_t recv_bytes) {
    const char *err = comm_in_place_error(rule, send, send_bytes, recv, recv_bytes, g->rank);
    if (err) { fail("%s over %s: %s (a bug)", what, g->name, err); }
}

// Test hooks (TRAIN_GPT_COMM_FAULT, test_hooks.h): an all-reduce not made (skip), or made after the rank's next
// all-reduce on another group (swap: comm_fault_resume); either way its request has nothing to wait for.
static struct { Group *g; void *buf; size_t n; DType t; } comm_swapped;
static void comm_fault_defer(int fault, Group *g, void *buf, size_t n, DType t, CommRequest *async) {
    if (async) { async->active = 0; }
    if (fault == FAULT_SWAP) { comm_swapped.g = g; comm_swapped.buf = buf; comm_swapped.n = n; comm_swapped.t = t; }
}
static void comm_fault_resume(Group *g);

// buf (n) summed over the group, in place. async: NULL = the result is there for the next op.
static void comm_all_reduce(Group *g, void *buf, size_t n, DType t, CommRequest *async) {
    if (g->size == 1) { return; }
    int fault = test_hook_comm_fault(g->name, "all-reduce", flight_next_seq(g->flight));
    if (fault == FAULT_SKIP || fault == FAULT_SWAP) { comm_fault_defer(fault, g, buf, n, t, async); return; }
    if (fault == FAULT_COUNT) { n = n > 1 ? n / 2 : 1; }
    uint64_t id = comm_record(g, FL_ALL_REDUCE, -1, n, t, 0);
    comm_count(g, 2.0 * (g->size - 1) / g->size * n * comm_type_size(t));
    comm_mark(async, g);
    trace_begin();
    COMM_WATCH("all-reduce", g);
#ifdef USE_NCCL
    ncclCheck(ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, g->nccl, comm_stream_begin(g)));
    comm_stream_end(g, async);
#else
    if (async && n <= COMM_HOST_CHUNK) {
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(t), MPI_SUM, g->mpi, &async->req);
        async->active = 1;
    }
    else { mpi_all_reduce(g, buf, n, t); }
#endif
    comm_posted(g, id, async);
    comm_leave(g);
    COMM_TRACE_END("all-reduce", g, 2.0 * (g->size - 1) / g->size * n * comm_type_size(t), async);
    comm_fault_resume(g);
}

static void comm_fault_resume(Group *g) {
    if (comm_swapped.g == NULL || comm_swapped.g == g) { return; }
    Group *h = comm_swapped.g;
    comm_swapped.g = NULL;
    comm_all_reduce(h, comm_swapped.buf, comm_swapped.n, comm_swapped.t, NULL);
}

// send (size * n) summed over the group; rank i receives chunk i (n) in recv.
// In place when recv == send + rank * n (the rank's own chunk of the input buffer).
static void comm_reduce_scatter(Group *g, const void *send, void *recv, size_t n, DType t, CommRequest *async) {
    size_t es = comm_type_size(t);
    comm_check_in_place(g, "reduce-scatter", CHUNK_IN_WHOLE_SEND, send, g->size * n * es, recv, n * es);
    if (g->size == 1) { if (send != recv) { copy_on_device(recv, send, n * es); } return; }
    uint64_t id = comm_record(g, FL_REDUCE_SCATTER, -1, n, t, 0);
    comm_count(g, (double)(g->size - 1) * n * es);
    comm_mark(async, g);
    trace_begin();
    COMM_WATCH("reduce-scatter", g);
#ifdef USE_NCCL
    ncclCheck(ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, g->nccl, comm_stream_begin(g)));
    comm_stream_end(g, async);
#else
    // MPI's in-place reduce-scatter leaves the rank's chunk at the start of the buffer: move it
    int in_place = (const char *)recv == (const char *)send + g->rank * n * es;
    const void *sb = in_place ? MPI_IN_PLACE : send;
    void *rb = in_place ? (void *)send : recv;
    if (async && n <= COMM_HOST_CHUNK) {
        MPI_Ireduce_scatter_block(sb, rb, (int)n, mpi_type(t), MPI_SUM, g->mpi, &async->req);
        async->active = 1;
        async->move_bytes = in_place ? n * es : 0;
        async->move_dst = recv;
        async->move_src = send;
    } else if (n <= COMM_HOST_CHUNK) {
        MPI_Reduce_scatter_block(sb, rb, (int)n, mpi_type(t), MPI_SUM, g->mpi);
        if (in_place) { memmove(recv, send, n * es); }
    } else {
        mpi_reduce_scatter(g, send, recv, n, t);
    }
#endif
    comm_posted(g, id, async);
    comm_leave(g);
    COMM_TRACE_END("reduce-scatter", g, (g->size - 1.0) * n * es, async);
}

// every rank's send (n) concatenated in rank order into recv (size * n).
// In place when send == recv + rank * n.
static void comm_all_gather(Group *g, const void *send, void *recv, size_t n, DType t, CommRequest *async) {
    size_t es = comm_type_size(t);
    comm_check_in_place(g, "all-gather", CHUNK_IN_WHOLE_RECV, send, n * es, recv, g->size * n * es);
    if (g->size == 1) { if (send != recv) { copy_on_device(recv, send, n * es); } return; }
    if (test_hook_comm_fault(g->name, "all-gather", flight_next_seq(g->flight)) == FAULT_COUNT) { n = n > 1 ? n / 2 : 1; }
    uint64_t id = comm_record(g, FL_ALL_GATHER, -1, n, t, 0);
    comm_count(g, (double)(g->size - 1) * n * es);
    comm_mark(async, g);
    trace_begin();
    COMM_WATCH("all-gather", g);
#ifdef USE_NCCL
    ncclCheck(ncclAllGather(send, recv, n, nccl_type(t), g->nccl, comm_stream_begin(g)));
    comm_stream_end(g, async);
#else
    int in_place = ((const char *)send == (const char *)recv + g->rank * n * es);
    const void *sb = in_place ? MPI_IN_PLACE : send;
    if (async && n <= COMM_HOST_CHUNK) {
        MPI_Iallgather(sb, (int)n, mpi_type(t), recv, (int)n, mpi_type(t), g->mpi, &async->req);
        async->active = 1;
        async->move_bytes = 0;
    } else if (n <= COMM_HOST_CHUNK) {
        MPI_Allgather(sb, (int)n, mpi_type(t), recv, (int)n, mpi_type(t), g->mpi);
    } else {
        mpi_all_gather(g, send, recv, n, t);
    }
#endif
    comm_posted(g, id, async);
    comm_leave(g);
    COMM_TRACE_END("all-gather", g, (g->size - 1.0) * n * es, async);
}

// All-to-all with variable counts (expert dispatch): rank i sends send_counts[j] elements from
// send + send_offsets[j] to rank j, and receives recv_counts[j] elements at recv + recv_offsets[j].
// Counts and offsets are host arrays of group size, in elements.
static void comm_all_to_allv(Group *g, const void *send, const size_t *send_counts, const size_t *send_offsets,
                             void *recv, const size_t *recv_counts, const size_t *recv_offsets, DType t) {
    size_t es = comm_type_size(t), send_end = 0, recv_end = 0;
    for (int j = 0; j < g->size; j++) {
        if (send_offsets[j] + send_counts[j] > send_end) { send_end = send_offsets[j] + send_counts[j]; }
        if (recv_offsets[j] + recv_counts[j] > recv_end) { recv_end = recv_offsets[j] + recv_counts[j]; }
    }
    comm_check_in_place(g, "all-to-all", APART, send, send_end * es, recv, recv_end * es);
    if (g->size == 1) {
        copy_on_device((char *)recv + recv_offsets[0] * es, (const char *)send + send_offsets[0] * es,
                       send_counts[0] * es);
        return;
    }
    double sent = 0;
    size_t sending = 0;   // (its record's count: what this rank sends; the counts differ by rank)
    for (int j = 0; j < g->size; j++) { if (j != g->rank) { sent += send_counts[j] * es; } sending += send_counts[j]; }
    uint64_t id = comm_record(g, FL_ALL_TO_ALL, -1, sending, t, 0);
    comm_count(g, sent);
    trace_begin();
    COMM_WATCH("all-to-all", g);
#ifdef USE_NCCL
    cudaStream_t s = comm_stream_begin(g);
    ncclCheck(ncclGroupStart());
    for (int j = 0; j < g->size; j++) {
        if (send_counts[j]) {
            ncclCheck(ncclSend((const char *)send + send_offsets[j] * es, send_counts[j], nccl_type(t), j, g->nccl, s));
        }
        if (recv_counts[j]) {
            ncclCheck(ncclRecv((char *)recv + recv_offsets[j] * es, recv_counts[j], nccl_type(t), j, g->nccl, s));
        }
    }
    ncclCheck(ncclGroupEnd());
    comm_stream_end(g, NULL);
#else
    int *sc = (int *)malloc_check(sizeof(int) * 4 * g->size), *so = sc + g->size, *rc = sc + 2 * g->size,
        *ro = sc + 3 * g->size;
    for (int j = 0; j < g->size; j++) {   // (the dispatch rows' counts and offsets, in elements; MPI's are int)
        if (send_offsets[j] + send_counts[j] > INT_MAX || recv_offsets[j] + recv_counts[j] > INT_MAX) {
            fail("all-to-all over %s: %zu + %zu elements exceed MPI's int counts (the CPU build's limit)", g->name,
                 send_offsets[j] > recv_offsets[j] ? send_offsets[j] : recv_offsets[j],
                     send_counts[j] > recv_counts[j] ? send_counts[j] : recv_counts[j]);
        }
        sc[j] = (int)send_counts[j];
        so[j] = (int)send_offsets[j];
        rc[j] = (int)recv_counts[j];
        ro[j] = (int)recv_offsets[j];
    }
    MPI_Alltoallv(send, sc, so, mpi_type(t), recv, rc, ro, mpi_type(t), g->mpi);
    free(sc);
#endif
    comm_posted(g, id, NULL);
    comm_leave(g);
    COMM_TRACE_END("all-to-all", g, sent, (CommRequest *)NULL);
}

// Point-to-point within a group (pipeline stage boundaries): n elements to / from group rank peer.
static void comm_send(Group *g, const void *buf, size_t n, DType t, int peer) {
    comm_count(g, (double)n * comm_type_size(t));
    uint64_t id = comm_record(g, FL_SEND, peer, n, t, 0);
#ifdef USE_NCCL
    ncclCheck(ncclSend(buf, n, nccl_type(t), peer, g->nccl, comm_stream_begin(g)));
    comm_stream_end(g, NULL);
#else
    size_t es = comm_type_size(t);
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        MPI_Send((const char *)buf + o * es, (int)c, mpi_type(t), peer, 0, g->mpi);
    }
#endif
    comm_posted(g, id, NULL);
}

static void comm_recv(Group *g, void *buf, size_t n, DType t, int peer) {
    uint64_t id = comm_record(g, FL_RECV, peer, n, t, 0);
#ifdef USE_NCCL
    ncclCheck(ncclRecv(buf, n, nccl_type(t), peer, g->nccl, comm_stream_begin(g)));
    comm_stream_end(g, NULL);
#else
    size_t es = comm_type_size(t);
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        MPI_Recv((char *)buf + o * es, (int)c, mpi_type(t), peer, 0, g->mpi, MPI_STATUS_IGNORE);
    }
#endif
    comm_posted(g, id, NULL);
}

// One batch of point-to-point transfers within a group, started together (a pipeline exchange: a stage
// may send to and receive from both neighbours in one step; started one by one, two stages each
// waiting on its send to the other would wait forever). Messages between two ranks carry no tag: they
// match in the order they are posted, sends on one side to receives on the other, in both builds (NCCL
// matches a pair's sends and receives by order; MPI does too with one tag, by its non-overtaking rule).
// So a schedule that sends two kinds to one peer (with two stages the next one is also the previous
// one: activations and gradients) in another order than the peer receives them swaps them on the CPU
// as it would on GPUs, and test_gpt sees it (TRAIN_GPT_REVERSE_SENDS proves the matrix does).
// The receives are complete on return. The sends too, unless `sends` (one per send) is given: then they
// complete while the caller computes, and comm_wait(&sends[i]) comes before their buffers change. With
// `recvs` too (one per receive) nothing is complete on return: comm_wait(&recvs[i]) comes before the
// received buffer is read (CUDA: every request waits for the whole group).
// CPU: MPI_Irecv / MPI_Issend (a synchronous send completes only once received, as NCCL's do, so
// that the CPU runs catch an exchange that would deadlock on GPUs); CUDA: one NCCL group.
// kind: what the message is, for the point-to-point log alone (the sender's and the receiver's must agree: two
// messages of one size swapped between a pair would pass unnoticed otherwise)
typedef struct { int send; void *buf; size_t n; int peer; int kind; } P2POp;

#ifdef USE_NCCL
// comm_p2p's NCCL path: one NCCL group; an event per request, each recorded after the whole group.
static void comm_p2p_launch(Group *g, const P2POp *ops, int nops, DType t, CommRequest *sends, CommRequest *recvs, int nrecv) {
    cudaStream_t s = comm_stream_begin(g);
    uint64_t *ids = (uint64_t *)malloc_check(sizeof(uint64_t) * nops);   // (each message's record: complete with the group)
    ncclCheck(ncclGroupStart());
    for (int i = 0; i < nops; i++) {
        ids[i] = comm_record(g, ops[i].send ? FL_SEND : FL_RECV, ops[i].peer, ops[i].n, t, ops[i].kind);
        if (ops[i].send) { ncclCheck(ncclSend(ops[i].buf, ops[i].n, nccl_type(t), ops[i].peer, g->nccl, s)); }
        else { ncclCheck(ncclRecv(ops[i].buf, ops[i].n, nccl_type(t), ops[i].peer, g->nccl, s)); }
    }
    ncclCheck(ncclGroupEnd());
    for (int i = 0; i < nops; i++) { comm_posted(g, ids[i], NULL); }
    free(ids);
    test_hook_stall("exchange", -1);
    if (sends && recvs) {
        for (int i = 0, ns = 0, nr = 0; i < nops; i++) {
            CommRequest *r = ops[i].send ? &sends[ns++] : &recvs[nr++];
            comm_mark(r, g);
            comm_stream_end(g, r);
        }
    }
    else if (sends && nrecv == 0) {   // (one event for the group)
        comm_mark(&sends[0], g);
        comm_stream_end(g, &sends[0]);
    }
    else { comm_stream_end(g, NULL); }
}
#else
// comm_p2p's MPI receives: each receive's record (into ids from *nid on), then its pieces posted (MPI_Irecv, into
// recv_req). Returns the number of requests posted.
static int comm_p2p_post_recvs(Group *g, const P2POp *ops, int nops, DType t, MPI_Request *recv_req, uint64_t *ids,
                               int *nid) {
    size_t es = comm_type_size(t);
    int nr = 0;
    for (int i = 0; i < nops; i++) {   // the receives first: a send then finds its receive posted
        if (!ops[i].send) { ids[(*nid)++] = comm_record(g, FL_RECV, ops[i].peer, ops[i].n, t, ops[i].kind); }
        for (size_t o = 0, c; !ops[i].send && o < ops[i].n; o += c) {
            c = comm_piece(ops[i].n, o);
            MPI_Irecv((char *)ops[i].buf + o * es, (int)c, mpi_type(t), ops[i].peer, 0, g->mpi,
                      &recv_req[nr++]);
        }
    }
    return nr;
}

// comm_p2p's MPI sends (synchronous: MPI_Issend), in the order of ops (reversed under TRAIN_GPT_REVERSE_SENDS): each
// send's record (into ids from *nid on), then its pieces posted (into send_req). Returns the number of requests posted.
static int comm_p2p_post_sends(Group *g, const P2POp *ops, int nops, DType t, MPI_Request *send_req, uint64_t *ids,
                               int *nid) {
    size_t es = comm_type_size(t);
    int ns = 0;
    int reverse = test_hook_reverse_sends();
    for (int k = 0; k < nops; k++) {
        int i = reverse ? nops - 1 - k : k;
        if (ops[i].send) { ids[(*nid)++] = comm_record(g, FL_SEND, ops[i].peer, ops[i].n, t, ops[i].kind); }
        for (size_t o = 0, c; ops[i].send && o < ops[i].n; o += c) {
            c = comm_piece(ops[i].n, o);
            MPI_Issend((char *)ops[i].buf + o * es, (int)c, mpi_type(t), ops[i].peer, 0, g->mpi,
                       &send_req[ns++]);
        }
    }
    return ns;
}

// The caller's requests (out: n of them, one per message) take over the n posted MPI requests (req), their messages'
// records (ids) marked posted with them: complete when the caller's comm_wait says so.
static void comm_p2p_hand_over(Group *g, CommRequest *out, const MPI_Request *req, const uint64_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        comm_mark(&out[i], g);
        out[i].req = req[i];
        out[i].active = 1;
        out[i].move_bytes = 0;
        comm_posted(g, ids[i], &out[i]);
    }
}

// comm_p2p's MPI path: the receives posted, then the sends (synchronous sends), in pieces of at most
// COMM_HOST_CHUNK elements.
static void comm_p2p_launch(Group *g, const P2POp *ops, int nops, DType t, CommRequest *sends, CommRequest *recvs, int nrecv) {
    (void)nrecv;
    size_t pieces = 0;   // a message of more than COMM_HOST_CHUNK elements goes in pieces (then it completes here)
    for (int i = 0; i < nops; i++) { pieces += (ops[i].n + COMM_HOST_CHUNK - 1) / COMM_HOST_CHUNK; }
    if (pieces > (size_t)nops) {   // (blocking: the caller's requests say there is nothing to wait for)
        for (int i = 0, ns = 0, nr = 0; i < nops; i++) {
            CommRequest *r = ops[i].send ? (sends ? &sends[ns++] : NULL) : (recvs ? &recvs[nr++] : NULL);
            if (r) { r->active = 0; }
        }
        sends = recvs = NULL;
    }
    MPI_Request *recv_req = (MPI_Request *)calloc_check(pieces + 1, sizeof(MPI_Request)), *send_req = recv_req;
    uint64_t *ids = (uint64_t *)malloc_check(sizeof(uint64_t) * (nops + 1));   // each message's record, as posted
    int nid = 0;
    int nr = comm_p2p_post_recvs(g, ops, nops, t, recv_req, ids, &nid);
    send_req = recv_req + nr;
    int nrid = nid;   // (ids: the receives' records, then the sends')
    int ns = comm_p2p_post_sends(g, ops, nops, t, send_req, ids, &nid);
    test_hook_stall("exchange", -1);
    if (sends && recvs) {   // (requests given: no pieces, so one per message, in the order of ids)
        comm_p2p_hand_over(g, recvs, recv_req, ids, nr);
    } else {
        MPI_Waitall(nr, recv_req, MPI_STATUSES_IGNORE);
        for (int i = 0; i < nrid; i++) { comm_posted(g, ids[i], NULL); }
    }
    if (sends) {
        comm_p2p_hand_over(g, sends, send_req, ids + nrid, ns);
    } else {
        MPI_Waitall(ns, send_req, MPI_STATUSES_IGNORE);
        for (int i = nrid; i < nid; i++) { comm_posted(g, ids[i], NULL); }
    }
    free(recv_req);
    free(ids);
}
#endif

static void comm_p2p(Group *g, const P2POp *ops, int nops, DType t, CommRequest *sends, CommRequest *recvs) {
    size_t es = comm_type_size(t);
    double sent = 0, received = 0;
    int nrecv = 0;
    for (int i = 0; i < nops; i++) {   // (each message sent counts as a call)
        if (ops[i].send) { sent += (double)ops[i].n * es; comm_count(g, (double)ops[i].n * es); }
        else { received += (double)ops[i].n * es; nrecv++; }
        for (int j = 0; j < nops && !ops[i].send; j++) {   // a receive overlaps no other buffer of the exchange
            if (j != i && comm_overlap(ops[i].buf, ops[i].n * es, ops[j].buf, ops[j].n * es)) {
                fail("point-to-point exchange over %s: receive buffer %d overlaps buffer %d (a bug)", g->name, i, j);
            }
        }
    }
    trace_begin();
    COMM_WATCH("point-to-point exchange", g);
    comm_p2p_launch(g, ops, nops, t, sends, recvs, nrecv);
    comm_leave(g);
    COMM_TRACE_STREAM(g);
    trace_end("exchange", "comm", "\"group\":\"%s\",\"bytes\":%.0f,\"received\":%.0f", g->name, sent, received);
}

static void comm_barrier(Group *g) {
    device_synchronize();
    uint64_t id = g->size > 1 ? comm_record(g, FL_BARRIER, -1, 0, DT_BYTE, 0) : 0;
    COMM_WATCH("barrier", g);
    MPI_Barrier(g->mpi);
    comm_leave(g);
    flight_done(id);
}

// Makes the compute stream wait for an asynchronous collective (CPU: waits for it).
static void comm_wait(CommRequest *r) {
    if (!r->active) { return; }
    trace_begin();
    watch_enter("wait for an asynchronous collective", r->group ? r->group : "?");
    comm_t0 = monotonic_seconds();
#ifdef USE_NCCL
    cudaCheck(cudaStreamWaitEvent(main_stream, r->done, 0));
    cudaCheck(cudaEventDestroy(r->done));
#else
    flight_wait(r->flight);
    MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    if (r->move_bytes) { memmove(r->move_dst, r->move_src, r->move_bytes); }
    flight_done(r->flight);
#endif
    r->active = 0;
    comm_leave(r->g);
    trace_end("wait", "comm", NULL);
}

// ----------------------------------------------------------------------------
// collectives on host buffers: MPI on both backends, any count (in pieces of at most COMM_HOST_CHUNK
// elements), watched (guard.h; `what` is named if one makes no progress), not counted in the bytes

typedef enum { HOST_SUM, HOST_MAX, HOST_MIN } HostOp;
static MPI_Op mpi_op(HostOp op) { return op == HOST_MAX ? MPI_MAX : op == HOST_MIN ? MPI_MIN : MPI_SUM; }

// The world as a group, before there is a grid (the flags, the output dir, the checkpoints). (Recorded as the grid's
// world is: one group, whose calls are numbered together.)
static Group *comm_world(void) {
    static Group w;
    if (w.name == NULL) {
        w.name = "world";
        w.mpi = MPI_COMM_WORLD;
        MPI_Comm_size(MPI_COMM_WORLD, &w.size);
        MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
        w.flight = flight_group("world", w.size, w.rank, NULL);
    }
    return &w;
}

// A host collective's record (none where MPI is not called: one rank, or nothing to move).
static uint64_t comm_host_record(Group *g, int op, size_t n, DType t) {
    return g->size > 1 && (n > 0 || op == FL_BARRIER) ? comm_record(g, op, -1, n, t, 0) : 0;
}

// --check-collectives, a disagreement: every member's view of the call gathered; the group's rank 0 prints the error
// and the diagnosis naming both sides (flight_diagnosis.h's words), the others give it a moment; the job stops.
static void comm_disagreement(Group *g, int op, size_t n, DType t, uint32_t seq) {
    FlightRecord mine, *all = (FlightRecord *)malloc_check(sizeof(FlightRecord) * g->size);
    int *ranks = (int *)malloc_check(sizeof(int) * g->size), me = comm_world()->rank;
    memset(&mine, 0, sizeof(mine));
    mine.op = (uint8_t)op; mine.type = (uint8_t)t; mine.elem = (uint8_t)comm_type_size(t);
    mine.count = (int64_t)n; mine.seq = seq; mine.ctx = flight_header()->now;
    watch_enter("the gather of a disagreement (--check-collectives)", g->name);
    MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, g->mpi);
    watch_leave();
    for (int i = 0; i < g->size; i++) { ranks[i] = g->world_of ? g->world_of[i] : i; }
    char msg[256], line[2048];
    snprintf(msg, sizeof(msg), "rank %d: --check-collectives: the ranks of group %s disagree on its call #%u; stopping "
             "before it is made", me, g->name, seq);
    Line l = {line, sizeof(line), 0};
    fd_put(&l, "diagnosis: ");
    fd_disagree_line(&l, g->name, ranks, all, g->size);
    fd_put(&l, "\n");
    flight_end(FL_FAILED, msg);
    if (g->rank == 0) {
        fprintf(stderr, "error: %s\n", msg);
        fflush(stderr);
        if (write(2, line, strlen(line)) < 0) { /* nothing more to do */ }
    } else {
        sleep(2);
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
}

// --check-collectives: the group agrees on a collective before it is made, with one all-reduce (max) of its
// operation, count, type and number and of their negatives (max of -x = -min x), so every member learns whether all
// are equal (an all-to-all's counts differ by rank: not compared). A disagreement stops the job at once, naming both
// sides (comm_disagreement), before a mismatched call can hang or write past a buffer. (A collective one rank never
// reaches is not seen here: its check waits as the call would, and the watchdog's diagnosis names it.)
static void comm_check(Group *g, int op, size_t n, DType t, uint32_t seq) {
    double v[8] = {(double)op, op == FL_ALL_TO_ALL ? 0.0 : (double)n, (double)t, (double)seq};
    for (int i = 0; i < 4; i++) { v[4 + i] = -v[i]; }
    watch_enter("the agreement on a collective (--check-collectives)", g->name);
    MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_MAX, g->mpi);
    watch_leave();
    for (int i = 0; i < 4; i++) { if (v[i] != -v[4 + i]) { comm_disagreement(g, op, n, t, seq); } }
}

// The world's ranks with member set, as a group for host collectives only (rank order: key); the others
// get an empty group. comm_host_group_free after.
static void comm_host_group(Group *g, const char *name, int member, int key) {
    memset(g, 0, sizeof(*g));
    g->name = name;
    uint64_t id = comm_host_record(comm_world(), FL_SPLIT, 1, DT_INT);
    watch_enter("split of the world (a host group)", name);
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, key, &g->mpi);
    if (member) {   // (its members' world ranks: its instance, for the recorder)
        int world_rank = comm_world()->rank;
        MPI_Comm_size(g->mpi, &g->size);
        MPI_Comm_rank(g->mpi, &g->rank);
        g->world_of = (int *)malloc_check(sizeof(int) * g->size);
        MPI_Allgather(&world_rank, 1, MPI_INT, g->world_of, 1, MPI_INT, g->mpi);
        g->flight = flight_group(name, g->size, g->rank, g->world_of);
    }
    watch_leave();
    flight_done(id);
}

static void comm_host_group_free(Group *g) { if (g->size > 0) { MPI_Comm_free(&g->mpi); free(g->world_of); } }

// buf (n) of group rank root to every rank.
static void comm_host_bcast(Group *g, void *buf, size_t n, DType t, int root, const char *what) {
    size_t es = comm_type_size(t);
    uint64_t id = comm_host_record(g, FL_BROADCAST, n, t);
    watch_enter(what, g->name);
    for (size_t o = 0, c; o < n && g->size > 1; o += c) {
        c = comm_piece(n, o);
        MPI_Bcast((char *)buf + o * es, (int)c, mpi_type(t), root, g->mpi);
    }
    watch_leave();
    flight_done(id);
}

// buf (n) combined over the group by op, in place, on every rank.
static void comm_host_all_reduce(Group *g, void *buf, size_t n, DType t, HostOp op, const char *what) {
    size_t es = comm_type_size(t);
    uint64_t id = comm_host_record(g, FL_ALL_REDUCE, n, t);
    watch_enter(what, g->name);
    for (size_t o = 0, c; o < n && g->size > 1; o += c) {
        c = comm_piece(n, o);
        MPI_Allreduce(MPI_IN_PLACE, (char *)buf + o * es, (int)c, mpi_type(t), mpi_op(op), g->mpi);
    }
    watch_leave();
    flight_done(id);
}

// buf (n) summed over the group into group rank root's buf (the others' are left as they were).
static void comm_host_reduce_sum(Group *g, void *buf, size_t n, DType t, int root, const char *what) {
    size_t es = comm_type_size(t);
    uint64_t id = comm_host_record(g, FL_REDUCE, n, t);
    watch_enter(what, g->name);
    for (size_t o = 0, c; o < n && g->size > 1; o += c) {
        c = comm_piece(n, o);
        char *b = (char *)buf + o * es;
        MPI_Reduce(g->rank == root ? MPI_IN_PLACE : b, b, (int)c, mpi_type(t), MPI_SUM, root, g->mpi);
    }
    watch_leave();
    flight_done(id);
}

// Every rank's send (n) in rank order into recv (size, n): on group rank root only (gather), or on every
// rank (all-gather; recv NULL on the ranks a gather does not fill).
static void comm_host_gather_to(Group *g, const void *send, size_t n, void *recv, DType t, int root, const char *what) {
    size_t es = comm_type_size(t), p = g->size;
    int all = root < 0, mine = all || g->rank == root;
    if (p == 1) { memcpy(recv, send, n * es); return; }
    uint64_t id = comm_host_record(g, all ? FL_ALL_GATHER : FL_GATHER, n, t);
    watch_enter(what, g->name);
    char *tmp = mine ? (char *)malloc_check(p * comm_piece(n, 0) * es + 1) : NULL;
    for (size_t o = 0, c; o < n; o += c) {
        c = comm_piece(n, o);
        const char *sb = (const char *)send + o * es;
        if (all) { MPI_Allgather(sb, (int)c, mpi_type(t), tmp, (int)c, mpi_type(t), g->mpi); }
        else { MPI_Gather(sb, (int)c, mpi_type(t), tmp, (int)c, mpi_type(t), root, g->mpi); }
        for (size_t r = 0; mine && r < p; r++) { memcpy((char *)recv + (r * n + o) * es, tmp + r * c * es, c * es); }
    }
    free(tmp);
    watch_leave();
    flight_done(id);
}

static void comm_host_gather(Group *g, const void *send, size_t n, void *recv, DType t, int root, const char *what) {
    comm_host_gather_to(g, send, n, recv, t, root, what);
}

static void comm_host_all_gather(Group *g, const void *send, size_t n, void *recv, DType t, const char *what) {
    comm_host_gather_to(g, send, n, recv, t, -1, what);
}

static void comm_host_barrier(Group *g, const char *what) {
    uint64_t id = comm_host_record(g, FL_BARRIER, 0, DT_BYTE);
    watch_enter(what, g->name);
    MPI_Barrier(g->mpi);
    watch_leave();
    flight_done(id);
}

static void comm_reset_counters(Grid *grid) {
    Group *groups[9];
    int n = grid_groups(grid, groups, 1);
    for (int i = 0; i < n; i++) { groups[i]->bytes = 0; groups[i]->calls = 0; groups[i]->exposed = 0; }
}

// A size for people: B, KiB, MiB or GiB.
static const char *human_bytes(double b, char *out, size_t n) {
    static const char *units[4] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (b >= 1024.0 && u < 3) { b /= 1024.0; u++; }
    snprintf(out, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
    return out;
}

// Whether every rank holds rank 0's values (e.g. hashes of what each read): first[i] is the lowest rank whose
// mine[i] differs from rank 0's (the world's size: none). Every rank learns the same.
static void comm_host_agree(const uint64_t *mine, int n, int *first) {
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    uint64_t *ref = (uint64_t *)malloc_check(n * sizeof(uint64_t));
    memcpy(ref, mine, n * sizeof(uint64_t));
    comm_host_bcast(comm_world(), ref, n * 8, DT_BYTE, 0, "broadcast of the inputs' hashes");
    for (int i = 0; i < n; i++) { first[i] = mine[i] != ref[i] ? rank : world; }
    comm_host_all_reduce(comm_world(), first, n, DT_INT, HOST_MIN, "all-reduce (inputs agree)");
    free(ref);
}

// The comm report's table: a row per rank, a column per group that carried anything (bytes sent per step,
// calls in parentheses). all: (world, NG, 2) bytes and calls.
static void comm_report_table(Grid *grid, Group **groups, int NG, const double *all, const char *label) {
    int used[16] = {0}, any = 0;
    for (int i = 0; i < NG; i++) {
        for (int r = 0; r < grid->world_size; r++) { used[i] |= all[2 * NG * r + 2 * i + 1] > 0; }
        any |= used[i];
    }
    printf("comm report (%s): bytes sent per rank per step, calls in parentheses (ring formulas: all-reduce "
           "2(p-1)/p N, reduce-scatter and all-gather (p-1)/p N)\n", label);
    if (!any) { printf("  (no communication: every group has one rank)\n"); return; }
    printf("%4s", "rank");
    for (int i = 0; i < NG; i++) { if (used[i]) { printf(" | %-20s", groups[i]->name); } }
    printf("\n");
    for (int r = 0; r < grid->world_size; r++) {
        printf("%4d", r);
        for (int i = 0; i < NG; i++) {
            if (!used[i]) { continue; }
            char b[32], cell[48];
            snprintf(cell, sizeof(cell), "%s (%.0f)", human_bytes(all[2 * NG * r + 2 * i], b, sizeof(b)),
                     all[2 * NG * r + 2 * i + 1]);
            printf(" | %-20s", cell);
        }
        printf("\n");
    }
}

// Prints, per rank, the bytes this rank sent in each group since the last reset, and its calls: the table, then
// the lines "comm RANK GROUP BYTES" and "comm-calls RANK GROUP CALLS" (per step) for tools.
static int comm_report_world = 0;   // the report shows the world group too (Muon's all-to-alls: muon.h)
static void comm_report(Grid *grid, int steps, const char *label) {
    enum { NGMAX = 10 };
    Group *groups[NGMAX];
    int NG = grid_groups(grid, groups, comm_report_world);
    double mine[2 * NGMAX];
    for (int i = 0; i < NG; i++) {
        mine[2 * i] = groups[i]->bytes / steps;
        mine[2 * i + 1] = (double)groups[i]->calls / steps;
    }
    double *all = (double *)malloc_check(sizeof(double) * 2 * NG * grid->world_size);
    comm_host_gather(&grid->world, mine, 2 * NG, all, DT_DOUBLE, 0, "gather of the comm report");
    if (grid->rank == 0) {
        comm_report_table(grid, groups, NG, all, label);
        for (int r = 0; r < grid->world_size; r++) {
            for (int i = 0; i < NG; i++) { printf("comm %d %s %.0f\n", r, groups[i]->name, all[2 * NG * r + 2 * i]); }
            for (int i = 0; i < NG; i++) { printf("comm-calls %d %s %.0f\n", r, groups[i]->name, all[2 * NG * r + 2 * i + 1]); }
        }
        fflush(stdout);
    }
    free(all);
}

#endif
