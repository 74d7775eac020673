// NCCL on the emulated device: the NCCL calls the trainer makes (llmc/comm.h), run over MPI between the ranks of
// mpirun. The program is one translation unit: the functions nccl.h declares are defined here, non-static.
//
// What is modelled:
//   - a communicator is an MPI communicator of its members, made by MPI_Comm_create_group after a rendezvous of the
//     members with the rank that made the unique id ("communicators" below);
//   - each collective, and each ncclGroupStart/ncclGroupEnd group (one item per stream it names), is one EMU_NCCL
//     item queued on its stream (contract.h). The device thread starts it in NCCL's issue order: it reads its inputs
//     then (not at the call), posts nonblocking MPI messages on the communicator's own MPI communicator, and returns;
//     it is stepped again between other streams' work until every message has arrived, and writes its outputs then;
//   - sums in the ring's order, rounded to the data type after every addition: the same bits on every rank
//     ("the ring order" below);
//   - point-to-point messages between two ranks of a communicator match in the order they were issued;
//   - the errors NCCL returns: ncclInvalidArgument for a bad communicator, peer, count, type, op, pointer or unique
//     id, ncclInvalidUsage for a communicator used after ncclCommDestroy/ncclCommAbort and an unmatched
//     ncclGroupEnd (each with a line on stderr saying why); emu_fail for what a GPU would fault on or compute wrongly:
//     a buffer outside device memory, buffers that overlap without being in place, a message of the wrong size.
// Not modelled: timing and bandwidth, NCCL's protocols, channels, tree and NVLS algorithms (only the ring's order of
// additions), its exact chunking (ours is below), reductions other than ncclSum, fp8 types, configs, ncclCommSplit,
// buffer registration, and the calls the project does not make (broadcast, reduce, gather, scatter, all-to-all).
//
// Threads: ncclGetUniqueId, ncclCommInitRank and the calls that queue work run on the host thread; the steps run on
// the device thread; ncclCommAbort may come from any thread (the watchdog's). MPI must be initialised with
// MPI_THREAD_MULTIPLE: the device thread's MPI calls (only on the communicators made here) run while the host makes
// its own.
#ifndef LLMC_EMU_NCCL_H
#define LLMC_EMU_NCCL_H

#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <pthread.h>
#include <mpi.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <nccl.h>
#include "contract.h"

// ----------------------------------------------------------------------------
// communicators
//
// The unique id names the world rank that made it (the root) and a counter of the ids it made. ncclCommInitRank is
// called by the communicator's members only, so the members are found by a rendezvous with the root over
// MPI_COMM_WORLD, point to point: each member sends the root (nranks, its rank, its world rank), the root answers
// each with the list of the members' world ranks in communicator rank order, and the members make the communicator
// with MPI_Comm_create_group (collective over the members only). No call is collective over the world, so the
// members may create it whenever the other ranks are busy elsewhere.
// ASSUMPTION: nothing else sends or receives point-to-point messages on MPI_COMM_WORLD with a tag in
// [NCCL_EMU_WORLD_TAG, NCCL_EMU_WORLD_TAG + 3 * NCCL_EMU_WORLD_SLOTS) or with MPI_ANY_TAG (the project's host code
// uses only collectives on MPI_COMM_WORLD). The tags cycle over NCCL_EMU_WORLD_SLOTS ids of one root: a root's id is
// used less than that many ids after it was made (the counter is checked: a wrong match fails loudly).

#define NCCL_EMU_ID_MAGIC 0x31554d454c43434eull   // "NCCLEMU1"
#define NCCL_EMU_WORLD_TAG 30000                    // (within the 32767 every MPI allows)
#define NCCL_EMU_WORLD_SLOTS 256
enum { NCCL_EMU_JOIN, NCCL_EMU_REPLY, NCCL_EMU_CREATE };   // the three world tags of one id

typedef struct {
    uint64_t magic;
    uint64_t counter;   // the root's ids so far, this one included
    int32_t root;       // the world rank that made it
    int32_t world_size;
} NcclEmuId;

struct ncclComm {
    MPI_Comm mpi;          // its members, in communicator rank order
    int nranks, rank;
    int tag_span;          // collectives' tags cycle over this many calls (from MPI_TAG_UB)
    uint64_t next_seq;     // the collectives called on it so far (their tags)
    int pending;           // calls queued and not yet retired
    int destroyed;         // ncclCommDestroy or ncclCommAbort was called: no new calls
    int aborted;           // ncclCommAbort: pending calls are abandoned
    int freed;             // its MPI communicator is freed (once destroyed and nothing is pending)
    struct ncclComm *next; // every communicator ever made (a destroyed one stays, so a late use is recognised)
};

// The state shared between the host, the device thread and an aborting thread: the communicators' list and their
// pending / destroyed / aborted / freed fields.
static pthread_mutex_t nccl_emu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *nccl_emu_comms = NULL;
static uint64_t nccl_emu_ids_made = 0;

// A line on stderr saying why a call returns an error (NCCL's "NCCL WARN" lines).
static void nccl_emu_warn(const char *call, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "emulated NCCL: %s: %s\n", call, msg);
}

static int nccl_emu_world_rank(void) {
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int nccl_emu_world_tag(uint64_t counter, int which) {
    return NCCL_EMU_WORLD_TAG + 3 * (int)(counter % NCCL_EMU_WORLD_SLOTS) + which;
}

// ncclSuccess if comm is a live communicator made here; ncclInvalidArgument if it is none; ncclInvalidUsage if it
// was destroyed or aborted.
static ncclResult_t nccl_emu_check_comm(const char *call, ncclComm_t comm) {
    if (comm == NULL) { nccl_emu_warn(call, "comm is NULL"); return ncclInvalidArgument; }
    pthread_mutex_lock(&nccl_emu_lock);
    struct ncclComm *c = nccl_emu_comms;
    while (c != NULL && c != comm) { c = c->next; }
    int destroyed = c != NULL && c->destroyed;
    pthread_mutex_unlock(&nccl_emu_lock);
    if (c == NULL) { nccl_emu_warn(call, "comm %p is not a communicator", (void *)comm); return ncclInvalidArgument; }
    if (destroyed) { nccl_emu_warn(call, "comm %p was destroyed or aborted", (void *)comm); return ncclInvalidUsage; }
    return ncclSuccess;
}

// Frees the MPI communicator of a destroyed communicator once nothing is pending on it (under nccl_emu_lock). The
// struct stays on the list, marked, so that a later call on it returns ncclInvalidUsage.
static void nccl_emu_free_if_idle(struct ncclComm *c) {
    if (!c->destroyed || c->pending > 0 || c->freed) { return; }
    c->freed = 1;
    MPI_Comm_free(&c->mpi);   // (local: it waits for no rank; an abandoned request keeps it until it ends)
}

static int nccl_emu_is_aborted(struct ncclComm *c) {
    pthread_mutex_lock(&nccl_emu_lock);
    int a = c->aborted;
    pthread_mutex_unlock(&nccl_emu_lock);
    return a;
}

// A call is queued on c (or its group discarded: -1): the pending count, which ncclCommDestroy's free waits for.
static void nccl_emu_add_pending(struct ncclComm *c, int delta) {
    pthread_mutex_lock(&nccl_emu_lock);
    c->pending += delta;
    nccl_emu_free_if_idle(c);
    pthread_mutex_unlock(&nccl_emu_lock);
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

// An id naming this world rank and its count of ids made (called on the communicator's rank 0, then broadcast).
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (uniqueId == NULL) { nccl_emu_warn("ncclGetUniqueId", "uniqueId is NULL"); return ncclInvalidArgument; }
    if (!initialized) { nccl_emu_warn("ncclGetUniqueId", "MPI is not initialised"); return ncclInvalidUsage; }
    NcclEmuId id;
    memset(&id, 0, sizeof(id));
    pthread_mutex_lock(&nccl_emu_lock);
    id.counter = ++nccl_emu_ids_made;
    pthread_mutex_unlock(&nccl_emu_lock);
    id.magic = NCCL_EMU_ID_MAGIC;
    id.root = nccl_emu_world_rank();
    MPI_Comm_size(MPI_COMM_WORLD, &id.world_size);
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, &id, sizeof(id));
    return ncclSuccess;
}

// The root's side of the rendezvous: the other nranks - 1 members' joins (from any rank, the id's join tag), checked
// (the same nranks, distinct ranks), and the answer to each: {1, world rank of rank 0, ..., of rank nranks-1}, or {0}.
// world_of gets the list. Returns whether every member agreed.
static int nccl_emu_rendezvous_root(const NcclEmuId *id, int nranks, int rank, int *world_of) {
    int *joined = (int *)malloc(sizeof(int) * (nranks + 1)), ok = 1;
    int *reply = (int *)malloc(sizeof(int) * (nranks + 1));
    for (int i = 0; i < nranks; i++) { world_of[i] = -1; }
    world_of[rank] = id->root;
    for (int k = 0; k < nranks - 1; k++) {
        int msg[4];
        MPI_Status st;
        MPI_Recv(msg, 4, MPI_INT, MPI_ANY_SOURCE, nccl_emu_world_tag(id->counter, NCCL_EMU_JOIN), MPI_COMM_WORLD, &st);
        joined[k] = st.MPI_SOURCE;
        int seen = 0;
        for (int i = 0; i < nranks; i++) { seen |= world_of[i] == msg[2]; }
        if (msg[3] != (int)(id->counter % INT_MAX)) {
            fprintf(stderr, "emulated NCCL: ncclCommInitRank: world rank %d joined id %d of world rank %d with id %d "
                    "(more than %d ids of one root in use at once)\n", msg[2], (int)(id->counter % INT_MAX), id->root,
                    msg[3], NCCL_EMU_WORLD_SLOTS);
            ok = 0;
        } else if (msg[0] != nranks || msg[1] < 0 || msg[1] >= nranks || world_of[msg[1]] != -1 || seen) {
            nccl_emu_warn("ncclCommInitRank", "world rank %d joined as rank %d of %d ranks; the root (world rank %d) "
                          "has %d ranks, and that rank or world rank joined already, or is out of range", msg[2],
                          msg[1], msg[0], id->root, nranks);
            ok = 0;
        } else {
            world_of[msg[1]] = msg[2];
        }
    }
    reply[0] = ok;
    memcpy(reply + 1, world_of, sizeof(int) * nranks);
    for (int k = 0; k < nranks - 1; k++) {
        MPI_Send(reply, ok ? nranks + 1 : 1, MPI_INT, joined[k], nccl_emu_world_tag(id->counter, NCCL_EMU_REPLY),
                 MPI_COMM_WORLD);
    }
    free(joined);
    free(reply);
    return ok;
}

// A member's side: its join sent to the root, the root's answer received into world_of. Returns whether it is {1, ...}
// of nranks members.
static int nccl_emu_rendezvous_member(const NcclEmuId *id, int nranks, int rank, int *world_of) {
    int msg[4] = {nranks, rank, nccl_emu_world_rank(), (int)(id->counter % INT_MAX)}, n = 0;
    MPI_Send(msg, 4, MPI_INT, id->root, nccl_emu_world_tag(id->counter, NCCL_EMU_JOIN), MPI_COMM_WORLD);
    MPI_Message m;
    MPI_Status st;
    MPI_Mprobe(id->root, nccl_emu_world_tag(id->counter, NCCL_EMU_REPLY), MPI_COMM_WORLD, &m, &st);
    MPI_Get_count(&st, MPI_INT, &n);
    int *reply = (int *)malloc(sizeof(int) * (n > 0 ? n : 1));
    MPI_Mrecv(reply, n, MPI_INT, &m, MPI_STATUS_IGNORE);
    int ok = n == nranks + 1 && reply[0] == 1;
    if (ok) { memcpy(world_of, reply + 1, sizeof(int) * nranks); }
    else { nccl_emu_warn("ncclCommInitRank", "the root (world rank %d) refused rank %d of %d ranks", id->root, rank, nranks); }
    free(reply);
    return ok;
}

// The MPI communicator of the members world_of (in communicator rank order), made by the members only; errors are
// returned, not fatal (the steps report them through emu_fail, naming the call).
static MPI_Comm nccl_emu_create_mpi_comm(const NcclEmuId *id, int nranks, const int *world_of) {
    MPI_Group world_group, members;
    MPI_Comm mpi;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, world_of, &members);
    MPI_Comm_create_group(MPI_COMM_WORLD, members, nccl_emu_world_tag(id->counter, NCCL_EMU_CREATE), &mpi);
    MPI_Group_free(&members);
    MPI_Group_free(&world_group);
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    return mpi;
}

// The collectives' tags: 1 + 2 * (seq mod span) + phase (tag 0 is point-to-point), within MPI_TAG_UB.
static int nccl_emu_tag_span(void) {
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int tag_ub = flag && ub != NULL ? *ub : 32767;
    return (tag_ub - 1) / 2;
}

// Rank `rank` of a communicator of nranks ranks, the members being the ranks that call it with the same id (each
// exactly once). Blocks until every member has called it, as NCCL's does.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    const char *call = "ncclCommInitRank";
    NcclEmuId id;
    memcpy(&id, commId.internal, sizeof(id));
    int initialized = 0, world = 0, threads = 0;
    MPI_Initialized(&initialized);
    if (!initialized) { nccl_emu_warn(call, "MPI is not initialised"); return ncclInvalidUsage; }
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Query_thread(&threads);
    if (threads < MPI_THREAD_MULTIPLE) {
        emu_fail("ncclCommInitRank: the NCCL emulation needs MPI_Init_thread(MPI_THREAD_MULTIPLE) (the device thread "
                 "calls MPI while the host does)");
    }
    if (comm == NULL) { nccl_emu_warn(call, "comm is NULL"); return ncclInvalidArgument; }
    *comm = NULL;
    if (id.magic != NCCL_EMU_ID_MAGIC || id.root < 0 || id.root >= world || id.world_size != world) {
        nccl_emu_warn(call, "the unique id was not made by ncclGetUniqueId in this job");
        return ncclInvalidArgument;
    }
    if (nranks < 1 || nranks > world || rank < 0 || rank >= nranks) {
        nccl_emu_warn(call, "rank %d of %d ranks (the world has %d)", rank, nranks, world);
        return ncclInvalidArgument;
    }
    int *world_of = (int *)malloc(sizeof(int) * nranks);
    int ok = nccl_emu_world_rank() == id.root ? nccl_emu_rendezvous_root(&id, nranks, rank, world_of)
                                              : nccl_emu_rendezvous_member(&id, nranks, rank, world_of);
    if (!ok) { free(world_of); return ncclInvalidArgument; }
    struct ncclComm *c = (struct ncclComm *)calloc(1, sizeof(struct ncclComm));
    c->mpi = nccl_emu_create_mpi_comm(&id, nranks, world_of);
    free(world_of);
    c->nranks = nranks;
    c->rank = rank;
    c->tag_span = nccl_emu_tag_span();
    int mpi_rank = -1;
    MPI_Comm_rank(c->mpi, &mpi_rank);
    if (mpi_rank != rank) { emu_fail("ncclCommInitRank: MPI made rank %d of the communicator, not %d", mpi_rank, rank); }
    pthread_mutex_lock(&nccl_emu_lock);
    c->next = nccl_emu_comms;
    nccl_emu_comms = c;
    pthread_mutex_unlock(&nccl_emu_lock);
    *comm = c;
    return ncclSuccess;
}

// Ends the communicator: later calls on it return ncclInvalidUsage. Its queued calls still run (the runtime waits
// for them before a GPU would free it); its MPI communicator is freed when the last one retires, at once if none.
// NULL: nothing (as NCCL).
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) { return ncclSuccess; }
    ncclResult_t r = nccl_emu_check_comm("ncclCommDestroy", comm);
    if (r != ncclSuccess) { return r; }
    pthread_mutex_lock(&nccl_emu_lock);
    comm->destroyed = 1;
    nccl_emu_free_if_idle(comm);
    pthread_mutex_unlock(&nccl_emu_lock);
    return ncclSuccess;
}

// Ends the communicator at once, from any thread, waiting for nothing: its pending calls are abandoned at their next
// step (their receives cancelled, their sends left to MPI, their outputs never written); later calls on it return
// ncclInvalidUsage. NULL: nothing (as NCCL).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == NULL) { return ncclSuccess; }
    ncclResult_t r = nccl_emu_check_comm("ncclCommAbort", comm);
    if (r != ncclSuccess) { return r; }
    pthread_mutex_lock(&nccl_emu_lock);
    comm->destroyed = 1;
    comm->aborted = 1;
    nccl_emu_free_if_idle(comm);
    pthread_mutex_unlock(&nccl_emu_lock);
    return ncclSuccess;
}

// No error is ever asynchronous here: a failed message stops the rank (emu_fail) when its step sees it.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    ncclResult_t r = nccl_emu_check_comm("ncclCommGetAsyncError", comm);
    if (r != ncclSuccess) { return r; }
    if (asyncError == NULL) { nccl_emu_warn("ncclCommGetAsyncError", "asyncError is NULL"); return ncclInvalidArgument; }
    *asyncError = ncclSuccess;
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// data types and the ring order
//
// NCCL's ring all-reduce is a reduce-scatter followed by an all-gather around the ring 0 -> 1 -> ... -> n-1 -> 0.
// The buffer is cut into n chunks; chunk c starts at rank (c+1) % n, which passes it to (c+2) % n, which adds its
// own contribution and passes the sum on, ..., until rank c adds the last one:
//     s = x[(c+1)%n];  s = s + x[(c+2)%n];  ...;  s = s + x[c]        (each + rounded to the data type)
// Here every rank sends chunk c of its input to rank c (the chunk's owner), the owner adds the n contributions in
// that order, and (all-reduce) sends the sum to every rank: the same bits everywhere, whatever the timing.
// The chunks (ours, not NCCL's exact channel/loop slicing): count = n * base + rem elements; chunk c is the
// base + 1 elements after chunks 0..c-1 for c < rem, base elements for c >= rem. A reduce-scatter's chunk c is rank
// c's recvcount elements (the same rule with rem = 0).

// The bytes of one element; 0 for a type not modelled (fp8).
static size_t nccl_emu_type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

// acc[i] = acc[i] + x[i] for n elements, rounded to the type: bf16 and fp16 add in fp32 and round to nearest even
// (what __hadd does), fp32 and fp64 in their own precision, integers wrap around (two's complement).
static void nccl_emu_add(void *acc, const void *x, size_t n, ncclDataType_t t) {
    switch (t) {
        case ncclBfloat16: {
            __nv_bfloat16 *a = (__nv_bfloat16 *)acc;
            const __nv_bfloat16 *b = (const __nv_bfloat16 *)x;
            for (size_t i = 0; i < n; i++) { a[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i])); }
            break;
        }
        case ncclFloat16: {
            __half *a = (__half *)acc;
            const __half *b = (const __half *)x;
            for (size_t i = 0; i < n; i++) { a[i] = __float2half_rn(__half2float(a[i]) + __half2float(b[i])); }
            break;
        }
        case ncclFloat32: {
            float *a = (float *)acc;
            const float *b = (const float *)x;
            for (size_t i = 0; i < n; i++) { a[i] = a[i] + b[i]; }
            break;
        }
        case ncclFloat64: {
            double *a = (double *)acc;
            const double *b = (const double *)x;
            for (size_t i = 0; i < n; i++) { a[i] = a[i] + b[i]; }
            break;
        }
        case ncclInt8: case ncclUint8: {
            uint8_t *a = (uint8_t *)acc;
            const uint8_t *b = (const uint8_t *)x;
            for (size_t i = 0; i < n; i++) { a[i] = (uint8_t)(a[i] + b[i]); }
            break;
        }
        case ncclInt32: case ncclUint32: {
            uint32_t *a = (uint32_t *)acc;
            const uint32_t *b = (const uint32_t *)x;
            for (size_t i = 0; i < n; i++) { a[i] = a[i] + b[i]; }
            break;
        }
        case ncclInt64: case ncclUint64: {
            uint64_t *a = (uint64_t *)acc;
            const uint64_t *b = (const uint64_t *)x;
            for (size_t i = 0; i < n; i++) { a[i] = a[i] + b[i]; }
            break;
        }
        default: emu_fail("NCCL emulation: reduction of type %d", (int)t);
    }
}

// Chunk c of count elements cut into n chunks: its first element and its length (the split above).
static void nccl_emu_chunk(size_t count, int n, int c, size_t *begin, size_t *len) {
    size_t base = count / n, rem = count % n, uc = (size_t)c;
    *begin = uc * base + (uc < rem ? uc : rem);
    *len = base + (uc < rem ? 1 : 0);
}

// The sum of this rank's chunk (rank c of n) in ring order: parts holds the n contributions, rank p's at
// parts + p * len elements. Summed into the slot of rank (c+1) % n, which is returned.
static char *nccl_emu_ring_sum(char *parts, int n, int c, size_t len, size_t es, ncclDataType_t t) {
    char *s = parts + (size_t)((c + 1) % n) * len * es;
    for (int k = 2; k <= n; k++) { nccl_emu_add(s, parts + (size_t)((c + k) % n) * len * es, len, t); }
    return s;
}

// ----------------------------------------------------------------------------
// one call, as the device runs it

typedef enum { NCCL_EMU_ALL_REDUCE, NCCL_EMU_REDUCE_SCATTER, NCCL_EMU_ALL_GATHER, NCCL_EMU_SEND, NCCL_EMU_RECV } NcclEmuKind;
typedef enum { NCCL_EMU_NOT_STARTED, NCCL_EMU_FIRST, NCCL_EMU_SECOND, NCCL_EMU_DONE } NcclEmuPhase;

#define NCCL_EMU_P2P_TAG 0
#ifndef NCCL_EMU_PIECE
#define NCCL_EMU_PIECE ((size_t)1 << 30)   // the most bytes of one MPI message (MPI counts are int; a test sets less)
#endif

typedef struct {
    NcclEmuKind kind;
    const char *call;          // "ncclAllReduce", ... (for messages)
    struct ncclComm *comm;
    cudaStream_t stream;
    const void *send;
    void *recv;
    size_t count;              // all-reduce: elements; reduce-scatter: recvcount; all-gather: sendcount; send/recv
    ncclDataType_t type;
    size_t es;                 // bytes per element
    int peer;                  // send / recv
    uint64_t seq;              // a collective's number on its communicator (its tags)
    // as it runs
    NcclEmuPhase phase;
    char *stage;               // the input, copied at the start (all-reduce: then the gathered result)
    char *parts;               // reduce: the contributions to this rank's chunk; all-gather and recv: what arrives
    MPI_Request *req;          // the messages in flight
    long long *expect;         // per request: a receive's bytes (checked on arrival), -1 for a send
    MPI_Status *st;            // per request: its status (MPI_Testall's)
    int nreq, cap;
} NcclEmuOp;

static void nccl_emu_check_range(const NcclEmuOp *op, const void *p, size_t bytes, const char *buffer) {
    if (bytes > 0 && !emu_device_range(p, bytes)) {
        emu_fail("%s: %s %p (%zu bytes) is not inside one device allocation", op->call, buffer, p, bytes);
    }
}

static void nccl_emu_mpi_check(const NcclEmuOp *op, int rc, const char *what) {
    if (rc == MPI_SUCCESS) { return; }
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    emu_fail("%s (rank %d of %d): %s: %s", op->call, op->comm->rank, op->comm->nranks, what, text);
}

static void *nccl_emu_malloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) { emu_fail("NCCL emulation: out of host memory (%zu bytes)", bytes); }
    return p;
}

// Posts a message of `bytes` bytes (in pieces of at most NCCL_EMU_PIECE; none if 0) to or from communicator rank peer.
// ncclSend's are synchronous sends: complete only once received, as NCCL's (a send nobody receives hangs here too).
static void nccl_emu_post(NcclEmuOp *op, int is_send, void *buf, size_t bytes, int peer, int tag) {
    for (size_t o = 0; o < bytes; o += NCCL_EMU_PIECE) {
        int piece = (int)(bytes - o < NCCL_EMU_PIECE ? bytes - o : NCCL_EMU_PIECE);
        if (op->nreq == op->cap) {
            op->cap = op->cap ? 2 * op->cap : 8;
            op->req = (MPI_Request *)realloc(op->req, sizeof(MPI_Request) * op->cap);
            op->expect = (long long *)realloc(op->expect, sizeof(long long) * op->cap);
            op->st = (MPI_Status *)realloc(op->st, sizeof(MPI_Status) * op->cap);
            if (op->req == NULL || op->expect == NULL || op->st == NULL) { emu_fail("NCCL emulation: out of host memory"); }
        }
        MPI_Request *r = &op->req[op->nreq];
        int rc = !is_send ? MPI_Irecv((char *)buf + o, piece, MPI_BYTE, peer, tag, op->comm->mpi, r)
                 : op->kind == NCCL_EMU_SEND ? MPI_Issend((char *)buf + o, piece, MPI_BYTE, peer, tag, op->comm->mpi, r)
                 : MPI_Isend((char *)buf + o, piece, MPI_BYTE, peer, tag, op->comm->mpi, r);
        nccl_emu_mpi_check(op, rc, is_send ? "posting a send" : "posting a receive");
        op->expect[op->nreq++] = is_send ? -1 : piece;
    }
}

static int nccl_emu_collective_tag(const NcclEmuOp *op, int second) {
    return 1 + 2 * (int)(op->seq % (uint64_t)op->comm->tag_span) + second;
}

// All-reduce and reduce-scatter, first exchange: chunk p of the input to rank p, every rank's chunk of ours into
// parts (rank p's at p * len).
static void nccl_emu_post_reduce(NcclEmuOp *op, size_t total) {
    int n = op->comm->nranks, me = op->comm->rank, tag = nccl_emu_collective_tag(op, 0);
    size_t begin, len;
    nccl_emu_chunk(total, n, me, &begin, &len);
    op->parts = (char *)nccl_emu_malloc((size_t)n * len * op->es);
    if (len * op->es > 0) { memcpy(op->parts + (size_t)me * len * op->es, op->stage + begin * op->es, len * op->es); }
    for (int p = 0; p < n; p++) {
        if (p == me) { continue; }
        size_t pb, pl;
        nccl_emu_chunk(total, n, p, &pb, &pl);
        nccl_emu_post(op, 0, op->parts + (size_t)p * len * op->es, len * op->es, p, tag);
        nccl_emu_post(op, 1, op->stage + pb * op->es, pl * op->es, p, tag);
    }
}

// All-reduce, second exchange: the summed chunk sum (this rank's) to every rank, every rank's into stage (at its
// place in the buffer).
static void nccl_emu_post_gather_sums(NcclEmuOp *op, char *sum) {
    int n = op->comm->nranks, me = op->comm->rank, tag = nccl_emu_collective_tag(op, 1);
    size_t begin, len;
    nccl_emu_chunk(op->count, n, me, &begin, &len);
    if (len * op->es > 0) { memcpy(op->stage + begin * op->es, sum, len * op->es); }
    for (int p = 0; p < n; p++) {
        if (p == me) { continue; }
        size_t pb, pl;
        nccl_emu_chunk(op->count, n, p, &pb, &pl);
        nccl_emu_post(op, 0, op->stage + pb * op->es, pl * op->es, p, tag);
        nccl_emu_post(op, 1, sum, len * op->es, p, tag);
    }
}

// All-gather: our input to every rank, every rank's into parts (rank p's at p * count).
static void nccl_emu_post_all_gather(NcclEmuOp *op) {
    int n = op->comm->nranks, me = op->comm->rank, tag = nccl_emu_collective_tag(op, 0);
    size_t bytes = op->count * op->es;
    op->parts = (char *)nccl_emu_malloc((size_t)n * bytes);
    if (bytes > 0) { memcpy(op->parts + (size_t)me * bytes, op->stage, bytes); }
    for (int p = 0; p < n; p++) {
        if (p == me) { continue; }
        nccl_emu_post(op, 0, op->parts + (size_t)p * bytes, bytes, p, tag);
        nccl_emu_post(op, 1, op->stage, bytes, p, tag);
    }
}

// The bytes a call reads from its send buffer.
static size_t nccl_emu_input_bytes(const NcclEmuOp *op) {
    if (op->kind == NCCL_EMU_RECV) { return 0; }
    return (op->kind == NCCL_EMU_REDUCE_SCATTER ? (size_t)op->comm->nranks : 1) * op->count * op->es;
}

// The bytes a call writes to its receive buffer.
static size_t nccl_emu_output_bytes(const NcclEmuOp *op) {
    if (op->kind == NCCL_EMU_SEND) { return 0; }
    return (op->kind == NCCL_EMU_ALL_GATHER ? (size_t)op->comm->nranks : 1) * op->count * op->es;
}

// The start, on the device: the input read into stage, the first messages posted. (An aborted communicator's call
// does nothing.)
static void nccl_emu_start(NcclEmuOp *op) {
    op->phase = NCCL_EMU_FIRST;
    if (nccl_emu_is_aborted(op->comm)) { op->phase = NCCL_EMU_DONE; return; }
    size_t in = nccl_emu_input_bytes(op);
    nccl_emu_check_range(op, op->send, in, "sendbuff");
    op->stage = (char *)nccl_emu_malloc(in);
    if (in > 0) { memcpy(op->stage, op->send, in); }   // (a receive has no input: send is NULL)
    switch (op->kind) {
        case NCCL_EMU_ALL_REDUCE: nccl_emu_post_reduce(op, op->count); break;
        case NCCL_EMU_REDUCE_SCATTER: nccl_emu_post_reduce(op, (size_t)op->comm->nranks * op->count); break;
        case NCCL_EMU_ALL_GATHER: nccl_emu_post_all_gather(op); break;
        case NCCL_EMU_SEND: nccl_emu_post(op, 1, op->stage, in, op->peer, NCCL_EMU_P2P_TAG); break;
        case NCCL_EMU_RECV:
            op->parts = (char *)nccl_emu_malloc(nccl_emu_output_bytes(op));
            nccl_emu_post(op, 0, op->parts, nccl_emu_output_bytes(op), op->peer, NCCL_EMU_P2P_TAG);
            break;
    }
}

// Whether every message posted has completed; a receive of another size than the call's fails the rank.
static int nccl_emu_messages_done(NcclEmuOp *op) {
    if (op->nreq == 0) { return 1; }
    int flag = 0;
    MPI_Status *st = op->st;
    int rc = MPI_Testall(op->nreq, op->req, &flag, st);
    for (int i = 0; rc == MPI_ERR_IN_STATUS && i < op->nreq; i++) {
        if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) {
            nccl_emu_mpi_check(op, st[i].MPI_ERROR, "a message (its peer sent more than this call receives?)");
        }
    }
    nccl_emu_mpi_check(op, rc, "MPI_Testall");
    for (int i = 0; flag && i < op->nreq; i++) {
        int got = 0;
        MPI_Get_count(&st[i], MPI_BYTE, &got);
        if (op->expect[i] >= 0 && got != op->expect[i]) {
            emu_fail("%s (rank %d of %d): received %d bytes from rank %d where %lld were expected (a count or type "
                     "that differs between the ranks)", op->call, op->comm->rank, op->comm->nranks, got,
                     st[i].MPI_SOURCE, op->expect[i]);
        }
    }
    if (flag) { op->nreq = 0; }
    return flag;
}

// The end, on the device: the result written to the receive buffer.
static void nccl_emu_write_output(NcclEmuOp *op, const char *result) {
    size_t out = nccl_emu_output_bytes(op);
    nccl_emu_check_range(op, op->recv, out, "recvbuff");
    if (out > 0) { memcpy(op->recv, result, out); }
}

// The messages of a call that will never be waited for again: receives cancelled, sends left to MPI. Their buffers
// are left allocated (a send may still read its buffer, a receive that could not be cancelled may still write).
static void nccl_emu_abandon(NcclEmuOp *op) {
    for (int i = 0; i < op->nreq; i++) {
        if (op->req[i] == MPI_REQUEST_NULL) { continue; }
        if (op->expect[i] >= 0) { MPI_Cancel(&op->req[i]); }
        MPI_Request_free(&op->req[i]);
    }
    op->nreq = 0;
    op->stage = op->parts = NULL;
    op->phase = NCCL_EMU_DONE;
}

// One step of a started call: when its messages are all in, the next phase (all-reduce: the sum, then its gather) or
// the output. Returns whether the call is done.
static int nccl_emu_progress(NcclEmuOp *op) {
    if (op->phase == NCCL_EMU_DONE) { return 1; }
    if (nccl_emu_is_aborted(op->comm)) { nccl_emu_abandon(op); return 1; }
    if (!nccl_emu_messages_done(op)) { return 0; }
    int n = op->comm->nranks, me = op->comm->rank;
    size_t begin, len;
    if (op->kind == NCCL_EMU_ALL_REDUCE && op->phase == NCCL_EMU_FIRST) {
        nccl_emu_chunk(op->count, n, me, &begin, &len);
        nccl_emu_post_gather_sums(op, nccl_emu_ring_sum(op->parts, n, me, len, op->es, op->type));
        op->phase = NCCL_EMU_SECOND;
        return 0;
    }
    if (op->kind == NCCL_EMU_ALL_REDUCE) { nccl_emu_write_output(op, op->stage); }
    if (op->kind == NCCL_EMU_REDUCE_SCATTER) {
        nccl_emu_write_output(op, nccl_emu_ring_sum(op->parts, n, me, op->count, op->es, op->type));
    }
    if (op->kind == NCCL_EMU_ALL_GATHER || op->kind == NCCL_EMU_RECV) { nccl_emu_write_output(op, op->parts); }
    free(op->stage);
    free(op->parts);
    op->stage = op->parts = NULL;
    op->phase = NCCL_EMU_DONE;
    return 1;
}

// A call leaves its communicator (which may then be freed, if destroyed).
static void nccl_emu_retire(NcclEmuOp *op) {
    free(op->req);
    free(op->expect);
    free(op->st);
    op->req = NULL;
    op->expect = NULL;
    op->st = NULL;
    nccl_emu_add_pending(op->comm, -1);
}

// ----------------------------------------------------------------------------
// queued items: one call, or a group's calls on one stream

typedef struct {
    NcclEmuOp *ops;
    int nops;
    int started;
} NcclEmuWork;

// The item's step: at its first call every call of the item starts (all of a group's messages posted together, so
// a send and a receive between two ranks cannot wait on each other); then true once all are done.
static bool nccl_emu_work_step(NcclEmuWork *w) {
    if (!w->started) {
        for (int i = 0; i < w->nops; i++) { nccl_emu_start(&w->ops[i]); }
        w->started = 1;
    }
    int done = 1;
    for (int i = 0; i < w->nops; i++) { done &= nccl_emu_progress(&w->ops[i]); }
    if (!done) { return false; }
    for (int i = 0; i < w->nops; i++) { nccl_emu_retire(&w->ops[i]); }
    free(w->ops);
    free(w);
    return true;
}

// Queues the calls ops (all on one stream) as one item; the item owns them.
static void nccl_emu_queue(cudaStream_t stream, const char *what, NcclEmuOp *ops, int nops) {
    NcclEmuWork *w = (NcclEmuWork *)nccl_emu_malloc(sizeof(NcclEmuWork));
    w->ops = ops;
    w->nops = nops;
    w->started = 0;
    emu_enqueue(stream, EMU_NCCL, what, [w]() { return nccl_emu_work_step(w); });   // (the runtime copies the step)
}

// ----------------------------------------------------------------------------
// groups: ncclGroupStart/ncclGroupEnd nest; the calls between are held (per host thread, as NCCL's) and queued at the
// outermost ncclGroupEnd, one item per stream they name, in the order the streams first appear. A call that fails
// inside a group makes ncclGroupEnd return its error and queue nothing.

static thread_local int nccl_emu_group_depth = 0;
static thread_local ncclResult_t nccl_emu_group_error = ncclSuccess;
static thread_local NcclEmuOp *nccl_emu_group_ops = NULL;
static thread_local int nccl_emu_group_nops = 0, nccl_emu_group_cap = 0;

static void nccl_emu_group_add(const NcclEmuOp *op) {
    if (nccl_emu_group_nops == nccl_emu_group_cap) {
        nccl_emu_group_cap = nccl_emu_group_cap ? 2 * nccl_emu_group_cap : 16;
        nccl_emu_group_ops = (NcclEmuOp *)realloc(nccl_emu_group_ops, sizeof(NcclEmuOp) * nccl_emu_group_cap);
        if (nccl_emu_group_ops == NULL) { emu_fail("NCCL emulation: out of host memory"); }
    }
    nccl_emu_group_ops[nccl_emu_group_nops++] = *op;
}

static int nccl_emu_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const char *x = (const char *)a, *y = (const char *)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// A group's receive buffer may overlap no other buffer of the group (on a GPU the writes race with the others).
static void nccl_emu_group_check_overlaps(const NcclEmuOp *ops, int nops) {
    for (int i = 0; i < nops; i++) {
        if (ops[i].kind != NCCL_EMU_RECV) { continue; }
        for (int j = 0; j < nops; j++) {
            const void *other = ops[j].kind == NCCL_EMU_RECV ? ops[j].recv : ops[j].send;
            size_t bytes = ops[j].kind == NCCL_EMU_RECV ? nccl_emu_output_bytes(&ops[j]) : nccl_emu_input_bytes(&ops[j]);
            if (j != i && nccl_emu_overlap(ops[i].recv, nccl_emu_output_bytes(&ops[i]), other, bytes)) {
                emu_fail("ncclGroupEnd: the receive buffer of call %d (ncclRecv, %p) overlaps the buffer of call %d "
                         "(%s, %p) of the same group", i, ops[i].recv, j, ops[j].call, other);
            }
        }
    }
}

ncclResult_t ncclGroupStart(void) {
    nccl_emu_group_depth++;
    return ncclSuccess;
}

// The group's calls, one item per stream.
static void nccl_emu_group_queue(void) {
    NcclEmuOp *ops = nccl_emu_group_ops;
    int nops = nccl_emu_group_nops;
    char *queued = (char *)calloc(nops > 0 ? nops : 1, 1);
    for (int i = 0; i < nops; i++) {
        if (queued[i]) { continue; }
        NcclEmuOp *mine = (NcclEmuOp *)nccl_emu_malloc(sizeof(NcclEmuOp) * nops);
        int n = 0;
        for (int j = i; j < nops; j++) {
            if (!queued[j] && ops[j].stream == ops[i].stream) { mine[n++] = ops[j]; queued[j] = 1; }
        }
        char what[64];
        snprintf(what, sizeof(what), "ncclGroupEnd (%d call%s)", n, n == 1 ? "" : "s");
        nccl_emu_queue(ops[i].stream, n == 1 ? ops[i].call : what, mine, n);
    }
    free(queued);
}

ncclResult_t ncclGroupEnd(void) {
    if (nccl_emu_group_depth == 0) { nccl_emu_warn("ncclGroupEnd", "no ncclGroupStart to end"); return ncclInvalidUsage; }
    if (--nccl_emu_group_depth > 0) { return ncclSuccess; }
    ncclResult_t r = nccl_emu_group_error;
    if (r == ncclSuccess) {
        nccl_emu_group_check_overlaps(nccl_emu_group_ops, nccl_emu_group_nops);
        nccl_emu_group_queue();
    } else {
        for (int i = 0; i < nccl_emu_group_nops; i++) { nccl_emu_add_pending(nccl_emu_group_ops[i].comm, -1); }
    }
    nccl_emu_group_nops = 0;
    nccl_emu_group_error = ncclSuccess;
    return r;
}

// ----------------------------------------------------------------------------
// the calls

// A call's error: returned, and inside a group also remembered for ncclGroupEnd.
static ncclResult_t nccl_emu_error(ncclResult_t r) {
    if (nccl_emu_group_depth > 0 && nccl_emu_group_error == ncclSuccess) { nccl_emu_group_error = r; }
    return r;
}

// The checks NCCL makes at the call (its ArgsCheck) and the emulator's: the buffers inside device memory, and in
// place exactly or apart. Fills op's size fields; ncclSuccess if the call may be queued.
static ncclResult_t nccl_emu_check_call(NcclEmuOp *op, ncclRedOp_t red) {
    ncclResult_t r = nccl_emu_check_comm(op->call, op->comm);
    if (r != ncclSuccess) { return r; }
    op->es = nccl_emu_type_size(op->type);
    if (op->es == 0) { nccl_emu_warn(op->call, "data type %d is not supported", (int)op->type); return ncclInvalidArgument; }
    int reduces = op->kind == NCCL_EMU_ALL_REDUCE || op->kind == NCCL_EMU_REDUCE_SCATTER;
    if (reduces && red != ncclSum) {
        nccl_emu_warn(op->call, "reduction op %d is not modelled (only ncclSum)", (int)red);
        return ncclInvalidArgument;
    }
    int p2p = op->kind == NCCL_EMU_SEND || op->kind == NCCL_EMU_RECV;
    if (p2p && (op->peer < 0 || op->peer >= op->comm->nranks)) {
        nccl_emu_warn(op->call, "peer %d is not a rank of the communicator (%d ranks)", op->peer, op->comm->nranks);
        return ncclInvalidArgument;
    }
    size_t n = (size_t)op->comm->nranks;
    if (op->count > SIZE_MAX / op->es / n) {
        nccl_emu_warn(op->call, "count %zu overflows the buffer's size", op->count);
        return ncclInvalidArgument;
    }
    size_t in = nccl_emu_input_bytes(op), out = nccl_emu_output_bytes(op);
    if ((in > 0 && op->send == NULL) || (out > 0 && op->recv == NULL)) {
        nccl_emu_warn(op->call, "%s is NULL", in > 0 && op->send == NULL ? "sendbuff" : "recvbuff");
        return ncclInvalidArgument;
    }
    nccl_emu_check_range(op, op->send, in, "sendbuff");
    nccl_emu_check_range(op, op->recv, out, "recvbuff");
    const char *s = (const char *)op->send, *d = (const char *)op->recv;
    size_t me = (size_t)op->comm->rank;
    int in_place = (op->kind == NCCL_EMU_ALL_REDUCE && s == d) ||
                   (op->kind == NCCL_EMU_REDUCE_SCATTER && d == s + me * out) ||
                   (op->kind == NCCL_EMU_ALL_GATHER && s == d + me * in);
    if (!in_place && nccl_emu_overlap(s, in, d, out)) {
        emu_fail("%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap without being in place (NCCL's "
                 "result would be undefined)", op->call, (const void *)s, in, (const void *)d, out);
    }
    return ncclSuccess;
}

// Checks a call, and queues it (held, inside a group). A count of 0 is a no-op.
static ncclResult_t nccl_emu_call(NcclEmuOp *op, ncclRedOp_t red) {
    ncclResult_t r = nccl_emu_check_call(op, red);
    if (r != ncclSuccess) { return nccl_emu_error(r); }
    if (op->count == 0) { return ncclSuccess; }
    pthread_mutex_lock(&nccl_emu_lock);
    int destroyed = op->comm->destroyed;   // (by an abort on another thread since the check)
    if (!destroyed) {
        op->comm->pending++;
        if (op->kind != NCCL_EMU_SEND && op->kind != NCCL_EMU_RECV) { op->seq = op->comm->next_seq++; }
    }
    pthread_mutex_unlock(&nccl_emu_lock);
    if (destroyed) { nccl_emu_warn(op->call, "the communicator was aborted"); return nccl_emu_error(ncclInvalidUsage); }
    if (nccl_emu_group_depth > 0) { nccl_emu_group_add(op); return ncclSuccess; }
    NcclEmuOp *one = (NcclEmuOp *)nccl_emu_malloc(sizeof(NcclEmuOp));
    *one = *op;
    nccl_emu_queue(op->stream, op->call, one, 1);
    return ncclSuccess;
}

static NcclEmuOp nccl_emu_op(NcclEmuKind kind, const char *call, const void *send, void *recv, size_t count,
                             ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    NcclEmuOp op;
    memset(&op, 0, sizeof(op));
    op.kind = kind; op.call = call; op.send = send; op.recv = recv; op.count = count; op.type = type; op.peer = peer;
    op.comm = comm; op.stream = stream;
    return op;
}

// recvbuff (count) = the sum over the ranks of sendbuff (count), the same on every rank, in the ring order of each
// chunk. In place when sendbuff == recvbuff.
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    NcclEmuOp o = nccl_emu_op(NCCL_EMU_ALL_REDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, 0, comm, stream);
    return nccl_emu_call(&o, op);
}

// recvbuff (recvcount) on rank i = chunk i of the sum over the ranks of sendbuff (nranks * recvcount), summed in
// the ring order starting at rank (i+1) % nranks. In place when recvbuff == sendbuff + rank * recvcount.
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    NcclEmuOp o = nccl_emu_op(NCCL_EMU_REDUCE_SCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, 0,
                              comm, stream);
    return nccl_emu_call(&o, op);
}

// recvbuff (nranks * sendcount) = every rank's sendbuff (sendcount) in rank order. In place when
// sendbuff == recvbuff + rank * sendcount.
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    NcclEmuOp o = nccl_emu_op(NCCL_EMU_ALL_GATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, 0, comm,
                              stream);
    return nccl_emu_call(&o, ncclSum);
}

// count elements of sendbuff to rank peer, matched with peer's ncclRecv calls from this rank in issue order.
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    NcclEmuOp o = nccl_emu_op(NCCL_EMU_SEND, "ncclSend", sendbuff, NULL, count, datatype, peer, comm, stream);
    return nccl_emu_call(&o, ncclSum);
}

// count elements from rank peer into recvbuff (peer's ncclSend to this rank, in issue order, of the same size).
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    NcclEmuOp o = nccl_emu_op(NCCL_EMU_RECV, "ncclRecv", NULL, recvbuff, count, datatype, peer, comm, stream);
    return nccl_emu_call(&o, ncclSum);
}

#endif
