// The emulated NCCL (llmc/emu/nccl.h) on its own, under mpirun, with a tiny stand-in for the emulated runtime.
//   mpicxx -std=c++17 -O2 -Wall -Wextra -Wno-unused-function -Wno-missing-field-initializers -I/usr/local/cuda/include
//       -DOMPI_SKIP_MPICXX dev/emu/test_emu_nccl.cpp -o test_emu_nccl -lpthread
//   OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe --allow-run-as-root ./test_emu_nccl   (and -np 3)
// Each rank prints "rank R: N passed, M failed" and exits non-zero on a failure.
// The stand-in runtime: streams are queues of items, stepped in an interleaving seeded by the rank (so the ranks
// interleave differently), an NCCL item starting only after every NCCL item queued before it has started
// (contract.h); device memory is host memory (emu_device_range always says yes).
// What is checked: communicators over subgroups made only by their members (evens/odds, the ranks but 0, the world
// reversed, two ids of one root used out of order), all-reduce against the ring-order formula computed here
// independently (fp32 bit-exact, bf16 rounded after each addition by a rounding written here, fp64, int32; in
// place and not; counts not divisible by the ranks and smaller than them), reduce-scatter, all-gather (in place and
// not), grouped send/receive rings (two messages to one peer keep their order; a group over two streams), an
// all-to-all with uneven and zero counts (self included), nested groups, two and three communicators interleaved in
// different orders on different ranks, destroy with work queued, abort from another thread with a receive pending,
// and the errors (bad peer, type, op, comm, pointer, id, rank; unmatched ncclGroupEnd; a failing call in a group;
// use after destroy and abort).
#define NCCL_EMU_PIECE ((size_t)1000)   // messages cut in pieces of 1000 bytes: the pieces' path runs too
#include <math.h>
#include <deque>
#include <string>
#include <thread>
#include <chrono>
#include "../../llmc/emu/nccl.h"

static int world_rank = 0, world_size = 1;
static int passed = 0, failed = 0;

static void check(int ok, const char *fmt, ...) {
    if (ok) { passed++; return; }
    failed++;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: FAILED: %s\n", world_rank, msg);
}

// ----------------------------------------------------------------------------
// the stand-in runtime

typedef struct { EmuStep step; long nccl_order; int started; } Item;
#define NSTREAMS 4   // stream k is (cudaStream_t)k, 0 the legacy stream
static std::deque<Item> queues[NSTREAMS];
static long nccl_queued = 0, nccl_started = 0, items_queued = 0;
static uint64_t rng_state = 1;

void emu_enqueue(cudaStream_t stream, EmuKind kind, const char *what, EmuStep step) {
    (void)what;
    uintptr_t s = (uintptr_t)stream;
    if (s >= NSTREAMS) { emu_fail("emu_enqueue: no stream %p", (void *)stream); }
    Item it = {step, kind == EMU_NCCL ? nccl_queued++ : -1, 0};
    queues[s].push_back(it);
    items_queued++;
}

[[noreturn]] void emu_fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "emulated device: %s\n", msg);
    exit(1);
}

int emu_device_range(const void *p, size_t bytes) { (void)p; (void)bytes; return 1; }

static uint32_t next_random(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static int stream_ready(int s) {
    if (queues[s].empty()) { return 0; }
    const Item &it = queues[s].front();
    return it.nccl_order < 0 || it.started || it.nccl_order == nccl_started;
}

static int items_left(void) {
    int n = 0;
    for (int s = 0; s < NSTREAMS; s++) { n += (int)queues[s].size(); }
    return n;
}

// Steps the streams' heads (a ready one chosen at random each time) until every queue is empty (returns 1) or
// `seconds` have passed (returns 0).
static int run_device(double seconds) {
    auto t0 = std::chrono::steady_clock::now();
    while (items_left() > 0) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) { return 0; }
        int ready[NSTREAMS], n = 0;
        for (int s = 0; s < NSTREAMS; s++) { if (stream_ready(s)) { ready[n++] = s; } }
        if (n == 0) { emu_fail("run_device: no stream can run (an NCCL item waits for one queued before it)"); }
        Item &it = queues[ready[next_random() % n]].front();
        if (it.nccl_order >= 0 && !it.started) { nccl_started++; }
        it.started = 1;
        EmuStep step = it.step;   // (a copy, as the real runtime runs it)
        if (step()) {
            for (int s = 0; s < NSTREAMS; s++) {
                if (!queues[s].empty() && &queues[s].front() == &it) { queues[s].pop_front(); break; }
            }
        }
    }
    return 1;
}

static cudaStream_t stream_of(int k) { return (cudaStream_t)(uintptr_t)k; }

// ----------------------------------------------------------------------------
// communicators, made as comm.h makes them: rank 0 of the group makes the id, MPI broadcasts it over the group

typedef struct { ncclComm_t nccl; MPI_Comm mpi; int size, rank; } Comm;

// The group of the world ranks with colour `color` (MPI_UNDEFINED: not a member), ranked by key; only members
// call ncclCommInitRank.
static Comm make_comm(int color, int key) {
    Comm c = {NULL, MPI_COMM_NULL, 0, -1};
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &c.mpi);
    if (c.mpi == MPI_COMM_NULL) { return c; }
    MPI_Comm_size(c.mpi, &c.size);
    MPI_Comm_rank(c.mpi, &c.rank);
    ncclUniqueId id;
    if (c.rank == 0) { check(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId"); }
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, c.mpi);
    check(ncclCommInitRank(&c.nccl, c.size, id, c.rank) == ncclSuccess, "ncclCommInitRank (%d of %d)", c.rank, c.size);
    return c;
}

static void free_comm(Comm *c) {
    if (c->mpi == MPI_COMM_NULL) { return; }
    check(ncclCommDestroy(c->nccl) == ncclSuccess, "ncclCommDestroy");
    MPI_Comm_free(&c->mpi);
}

// ----------------------------------------------------------------------------
// inputs and the references, computed here without nccl.h's helpers

static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca6bu ^ (c + 0x165667b1u) * 0xc2b2ae35u;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
    return h;
}

// a value of rank r's input at i: sign, exponent in [-12, 12] and mantissa spread, so the order of additions shows
static double input_value(int r, size_t i, int salt) {
    uint32_t h = hash3((uint32_t)r, (uint32_t)i, (uint32_t)salt);
    double m = 1.0 + (h & 0xfffff) / (double)0x100000;
    int e = (int)((h >> 20) % 25) - 12;
    return (h >> 31 ? -1.0 : 1.0) * ldexp(m, e);
}

static uint16_t ref_bf16(float f) {   // round to nearest even (NaN kept quiet)
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40); }
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float ref_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// the chunk of element i of count elements cut into n chunks (the first count % n chunks one longer)
static int ref_chunk_of(size_t i, size_t count, int n) {
    size_t base = count / n, rem = count % n;
    if (i < rem * (base + 1)) { return (int)(i / (base + 1)); }
    return (int)(rem + (i - rem * (base + 1)) / base);
}

// the ring's order for chunk c: (c+1)%n first, c last
static int ring_member(int c, int k, int n) { return (c + 1 + k) % n; }

static float ref_sum_f32(int n, size_t i, int c, int salt) {
    float s = (float)input_value(ring_member(c, 0, n), i, salt);
    for (int k = 1; k < n; k++) { s = s + (float)input_value(ring_member(c, k, n), i, salt); }
    return s;
}
static uint16_t ref_sum_bf16(int n, size_t i, int c, int salt) {
    uint16_t s = ref_bf16((float)input_value(ring_member(c, 0, n), i, salt));
    for (int k = 1; k < n; k++) {
        s = ref_bf16(ref_float(s) + ref_float(ref_bf16((float)input_value(ring_member(c, k, n), i, salt))));
    }
    return s;
}
static double ref_sum_f64(int n, size_t i, int c, int salt) {
    double s = input_value(ring_member(c, 0, n), i, salt);
    for (int k = 1; k < n; k++) { s = s + input_value(ring_member(c, k, n), i, salt); }
    return s;
}
static int32_t int_value(int r, size_t i, int salt) { return (int32_t)hash3((uint32_t)r, (uint32_t)i, (uint32_t)salt); }
static int32_t ref_sum_i32(int n, size_t i) {
    uint32_t s = 0;
    for (int r = 0; r < n; r++) { s += (uint32_t)int_value(r, i, 5); }
    return (int32_t)s;
}

// Whether every rank of comm holds the same bytes (a hash compared).
static int same_on_every_rank(MPI_Comm comm, const void *p, size_t bytes) {
    uint64_t h = 1469598103934665603ull, lo, hi;
    for (size_t i = 0; i < bytes; i++) { h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull; }
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
    return lo == hi;
}

// ----------------------------------------------------------------------------
// the collectives

// All-reduce of fp32, bf16, fp64 and int32 over c (its ranks are its own: c.rank), in place or not.
static void test_all_reduce(Comm c, size_t count, int in_place, int salt, const char *name) {
    if (c.mpi == MPI_COMM_NULL) { return; }
    int n = c.size, r = c.rank;
    float *xf = (float *)malloc(count * 4 + 4), *yf = in_place ? xf : (float *)malloc(count * 4 + 4);
    uint16_t *xb = (uint16_t *)malloc(count * 2 + 2), *yb = in_place ? xb : (uint16_t *)malloc(count * 2 + 2);   // bf16 bits
    double *xd = (double *)malloc(count * 8 + 8), *yd = in_place ? xd : (double *)malloc(count * 8 + 8);
    int32_t *xi = (int32_t *)malloc(count * 4 + 4), *yi = in_place ? xi : (int32_t *)malloc(count * 4 + 4);
    for (size_t i = 0; i < count; i++) {
        xf[i] = (float)input_value(r, i, salt);
        xb[i] = ref_bf16((float)input_value(r, i, salt));
        xd[i] = input_value(r, i, salt);
        xi[i] = int_value(r, i, 5);
    }
    check(ncclAllReduce(xf, yf, count, ncclFloat, ncclSum, c.nccl, stream_of(1)) == ncclSuccess, "%s f32 call", name);
    check(ncclAllReduce(xb, yb, count, ncclBfloat16, ncclSum, c.nccl, stream_of(2)) == ncclSuccess, "%s bf16 call", name);
    check(ncclAllReduce(xd, yd, count, ncclFloat64, ncclSum, c.nccl, stream_of(3)) == ncclSuccess, "%s f64 call", name);
    check(ncclAllReduce(xi, yi, count, ncclInt32, ncclSum, c.nccl, stream_of(1)) == ncclSuccess, "%s i32 call", name);
    check(run_device(60), "%s: the device finished", name);
    size_t bad_f = 0, bad_b = 0, bad_d = 0, bad_i = 0, order_shows = 0;
    for (size_t i = 0; i < count; i++) {
        int ch = ref_chunk_of(i, count, n);
        float ef = ref_sum_f32(n, i, ch, salt);
        uint16_t eb = ref_sum_bf16(n, i, ch, salt), gb = yb[i];
        double ed = ref_sum_f64(n, i, ch, salt);
        bad_f += memcmp(&ef, &yf[i], 4) != 0;
        bad_b += eb != gb;
        bad_d += memcmp(&ed, &yd[i], 8) != 0;
        bad_i += ref_sum_i32(n, i) != yi[i];
        float rank_order = 0.0f;   // (the plain sum 0 + 1 + ... differs somewhere: the order is tested)
        for (int q = 0; q < n; q++) { rank_order += (float)input_value(q, i, salt); }
        order_shows += memcmp(&rank_order, &ef, 4) != 0;
    }
    check(bad_f == 0, "%s: fp32 all-reduce of %zu: %zu elements differ from the ring order's sum", name, count, bad_f);
    check(bad_b == 0, "%s: bf16 all-reduce of %zu: %zu elements differ", name, count, bad_b);
    check(bad_d == 0, "%s: fp64 all-reduce of %zu: %zu elements differ", name, count, bad_d);
    check(bad_i == 0, "%s: int32 all-reduce of %zu: %zu elements differ", name, count, bad_i);
    check(same_on_every_rank(c.mpi, yf, count * 4) && same_on_every_rank(c.mpi, yb, count * 2),
          "%s: every rank has the same bits", name);
    if (count > 100 && n > 2) { check(order_shows > 0, "%s: the data shows the order of additions", name); }
    free(xf); free(xb); free(xd); free(xi);
    if (!in_place) { free(yf); free(yb); free(yd); free(yi); }
}

// Reduce-scatter of fp32 and bf16 (recvcount per rank), in place (recv = send + rank * count) or not.
static void test_reduce_scatter(Comm c, size_t count, int in_place, int salt, const char *name) {
    if (c.mpi == MPI_COMM_NULL) { return; }
    int n = c.size, r = c.rank;
    size_t total = (size_t)n * count;
    float *xf = (float *)malloc(total * 4 + 4), *yf = in_place ? xf + (size_t)r * count : (float *)malloc(count * 4 + 4);
    uint16_t *xb = (uint16_t *)malloc(total * 2 + 2), *yb = in_place ? xb + (size_t)r * count : (uint16_t *)malloc(count * 2 + 2);
    for (size_t i = 0; i < total; i++) {
        xf[i] = (float)input_value(r, i, salt);
        xb[i] = ref_bf16((float)input_value(r, i, salt));
    }
    check(ncclReduceScatter(xf, yf, count, ncclFloat, ncclSum, c.nccl, stream_of(1)) == ncclSuccess, "%s call", name);
    check(ncclReduceScatter(xb, yb, count, ncclBfloat16, ncclSum, c.nccl, stream_of(2)) == ncclSuccess, "%s call", name);
    check(run_device(60), "%s: the device finished", name);
    size_t bad_f = 0, bad_b = 0, untouched = 0;
    for (size_t j = 0; j < count; j++) {
        size_t i = (size_t)r * count + j;
        float ef = ref_sum_f32(n, i, r, salt);
        bad_f += memcmp(&ef, &yf[j], 4) != 0;
        bad_b += ref_sum_bf16(n, i, r, salt) != yb[j];
    }
    for (size_t i = 0; in_place && i < total; i++) {   // (in place: the other chunks of the input are as they were)
        if (i / count == (size_t)r) { continue; }
        float v = (float)input_value(r, i, salt);
        untouched += memcmp(&v, &xf[i], 4) == 0;
    }
    check(bad_f == 0, "%s: fp32 reduce-scatter of %zu: %zu elements differ from the ring order's sum", name, count, bad_f);
    check(bad_b == 0, "%s: bf16 reduce-scatter of %zu: %zu elements differ", name, count, bad_b);
    if (in_place) { check(untouched == total - count, "%s: the other chunks kept", name); }
    free(xf); free(xb);
    if (!in_place) { free(yf); free(yb); }
}

// All-gather of int32, in place (send = recv + rank * count) or not.
static void test_all_gather(Comm c, size_t count, int in_place, const char *name) {
    if (c.mpi == MPI_COMM_NULL) { return; }
    int n = c.size, r = c.rank;
    int32_t *recv = (int32_t *)malloc((size_t)n * count * 4 + 4), *send = in_place ? recv + (size_t)r * count
                                                                               : (int32_t *)malloc(count * 4 + 4);
    for (size_t i = 0; i < (size_t)n * count; i++) { recv[i] = -1; }
    for (size_t i = 0; i < count; i++) { send[i] = int_value(r, i, 9); }
    check(ncclAllGather(send, recv, count, ncclInt32, c.nccl, stream_of(2)) == ncclSuccess, "%s call", name);
    check(run_device(60), "%s: the device finished", name);
    size_t bad = 0;
    for (int q = 0; q < n; q++) {
        for (size_t i = 0; i < count; i++) { bad += recv[(size_t)q * count + i] != int_value(q, i, 9); }
    }
    check(bad == 0, "%s: all-gather of %zu: %zu elements differ", name, count, bad);
    free(recv);
    if (!in_place) { free(send); }
}

// ----------------------------------------------------------------------------
// point to point

static float message_value(int from, int to, int which, size_t i) { return (float)(from * 1000000 + to * 10000 + which * 1000) + (float)i; }

// A ring in one group: two messages to the next rank (of different sizes: their order must hold), two from the
// previous; sends on stream s1, receives on stream s2 (two items when they differ).
static void test_ring(Comm c, int s1, int s2, const char *name) {
    if (c.mpi == MPI_COMM_NULL) { return; }
    int n = c.size, r = c.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    size_t na = 300 + r, nb = 700 + 2 * r, pa = 300 + prev, pb = 700 + 2 * prev;
    float *a = (float *)malloc(na * 4), *b = (float *)malloc(nb * 4), *ra = (float *)malloc(pa * 4), *rb = (float *)malloc(pb * 4);
    for (size_t i = 0; i < na; i++) { a[i] = message_value(r, next, 0, i); }
    for (size_t i = 0; i < nb; i++) { b[i] = message_value(r, next, 1, i); }
    long before = items_queued;
    check(ncclGroupStart() == ncclSuccess, "%s: ncclGroupStart", name);
    check(ncclSend(a, na, ncclFloat, next, c.nccl, stream_of(s1)) == ncclSuccess, "%s: ncclSend a", name);
    check(ncclRecv(ra, pa, ncclFloat, prev, c.nccl, stream_of(s2)) == ncclSuccess, "%s: ncclRecv a", name);
    check(ncclSend(b, nb, ncclFloat, next, c.nccl, stream_of(s1)) == ncclSuccess, "%s: ncclSend b", name);
    check(ncclRecv(rb, pb, ncclFloat, prev, c.nccl, stream_of(s2)) == ncclSuccess, "%s: ncclRecv b", name);
    check(items_queued == before, "%s: nothing queued inside the group", name);
    check(ncclGroupEnd() == ncclSuccess, "%s: ncclGroupEnd", name);
    check(items_queued - before == (s1 == s2 ? 1 : 2), "%s: one item per stream (%ld)", name, items_queued - before);
    check(run_device(60), "%s: the device finished", name);
    size_t bad = 0;
    for (size_t i = 0; i < pa; i++) { bad += ra[i] != message_value(prev, r, 0, i); }
    for (size_t i = 0; i < pb; i++) { bad += rb[i] != message_value(prev, r, 1, i); }
    check(bad == 0, "%s: %zu elements received wrong", name, bad);
    free(a); free(b); free(ra); free(rb);
}

// All-to-all with uneven counts, zeros among them (called anyway: no-ops), self included; in nested groups
// (the sends in one inner group, the receives in another).
static size_t a2a_count(int from, int to) { return (size_t)((from * 3 + to * 5) % 4) * 37; }
static void test_all_to_all(Comm c, const char *name) {
    if (c.mpi == MPI_COMM_NULL) { return; }
    int n = c.size, r = c.rank;
    size_t *so = (size_t *)calloc(n + 1, sizeof(size_t)), *ro = (size_t *)calloc(n + 1, sizeof(size_t));
    for (int j = 0; j < n; j++) { so[j + 1] = so[j] + a2a_count(r, j); ro[j + 1] = ro[j] + a2a_count(j, r); }
    float *send = (float *)malloc(so[n] * 4 + 4), *recv = (float *)malloc(ro[n] * 4 + 4);
    for (int j = 0; j < n; j++) { for (size_t i = 0; i < a2a_count(r, j); i++) { send[so[j] + i] = message_value(r, j, 2, i); } }
    for (size_t i = 0; i < ro[n]; i++) { recv[i] = -1.0f; }
    long before = items_queued;
    check(ncclGroupStart() == ncclSuccess, "%s: outer ncclGroupStart", name);
    check(ncclGroupStart() == ncclSuccess, "%s: inner ncclGroupStart", name);
    for (int j = 0; j < n; j++) {
        check(ncclSend(send + so[j], a2a_count(r, j), ncclFloat, j, c.nccl, stream_of(3)) == ncclSuccess, "%s: send", name);
    }
    check(ncclGroupEnd() == ncclSuccess && items_queued == before, "%s: inner ncclGroupEnd queues nothing", name);
    check(ncclGroupStart() == ncclSuccess, "%s: second inner ncclGroupStart", name);
    for (int j = 0; j < n; j++) {
        check(ncclRecv(recv + ro[j], a2a_count(j, r), ncclFloat, j, c.nccl, stream_of(3)) == ncclSuccess, "%s: recv", name);
    }
    check(ncclGroupEnd() == ncclSuccess && items_queued == before, "%s: second inner ncclGroupEnd queues nothing", name);
    long expected = so[n] + ro[n] > 0 ? 1 : 0;   // (a group of count-0 calls only queues nothing)
    check(ncclGroupEnd() == ncclSuccess && items_queued == before + expected, "%s: the outer ncclGroupEnd queues %ld item",
          name, expected);
    check(run_device(60), "%s: the device finished", name);
    size_t bad = 0;
    for (int j = 0; j < n; j++) { for (size_t i = 0; i < a2a_count(j, r); i++) { bad += recv[ro[j] + i] != message_value(j, r, 2, i); } }
    check(bad == 0, "%s: %zu elements received wrong", name, bad);
    free(so); free(ro); free(send); free(recv);
}

// ----------------------------------------------------------------------------
// several communicators at once

// The world's, the reversed world's and the evens'/odds' calls queued on different streams, in a different order on
// odd ranks than on even ones (each communicator's own calls in one order everywhere), then run together.
static void test_interleaved(Comm world, Comm reversed, Comm parity) {
    int n = world.size;
    size_t count = 517;
    float *a = (float *)malloc(count * 4), *b = (float *)malloc(count * 4), *g = (float *)malloc((size_t)n * 64 * 4);
    float *p = (float *)malloc(count * 4);
    for (size_t i = 0; i < count; i++) {
        a[i] = (float)input_value(world.rank, i, 21);
        b[i] = (float)input_value(reversed.rank, i, 22);
        p[i] = (float)input_value(parity.rank, i, 23);
    }
    for (size_t i = 0; i < 64; i++) { g[(size_t)world.rank * 64 + i] = message_value(world.rank, 0, 3, i); }
    int odd = world_rank % 2;
    for (int k = 0; k < 2; k++) {
        if (k == odd) {
            check(ncclAllReduce(a, a, count, ncclFloat, ncclSum, world.nccl, stream_of(1)) == ncclSuccess, "world call");
            check(ncclAllGather(g + (size_t)world.rank * 64, g, 64, ncclFloat, world.nccl, stream_of(1)) == ncclSuccess,
                  "world all-gather call");
        } else {
            check(ncclAllReduce(p, p, count, ncclFloat, ncclSum, parity.nccl, stream_of(2)) == ncclSuccess, "parity call");
            check(ncclAllReduce(b, b, count, ncclFloat, ncclSum, reversed.nccl, stream_of(3)) == ncclSuccess, "reversed call");
        }
    }
    check(run_device(60), "interleaved: the device finished");
    size_t bad_a = 0, bad_b = 0, bad_g = 0, bad_p = 0;
    for (size_t i = 0; i < count; i++) {
        float ea = ref_sum_f32(n, i, ref_chunk_of(i, count, n), 21), eb = ref_sum_f32(n, i, ref_chunk_of(i, count, n), 22);
        float ep = ref_sum_f32(parity.size, i, ref_chunk_of(i, count, parity.size), 23);
        bad_a += memcmp(&ea, &a[i], 4) != 0;
        bad_b += memcmp(&eb, &b[i], 4) != 0;
        bad_p += memcmp(&ep, &p[i], 4) != 0;
    }
    for (int q = 0; q < n; q++) { for (size_t i = 0; i < 64; i++) { bad_g += g[(size_t)q * 64 + i] != message_value(q, 0, 3, i); } }
    check(bad_a == 0 && bad_b == 0 && bad_p == 0 && bad_g == 0, "interleaved: wrong elements: world %zu, reversed %zu, "
          "parity %zu, all-gather %zu", bad_a, bad_b, bad_p, bad_g);
    free(a); free(b); free(g); free(p);
}

// Two ids made by one root before either is used, the communicators made in the other order.
static void test_two_ids(void) {
    ncclUniqueId ids[2];
    if (world_rank == world_size - 1) {
        check(ncclGetUniqueId(&ids[0]) == ncclSuccess && ncclGetUniqueId(&ids[1]) == ncclSuccess, "two ids");
    }
    MPI_Bcast(ids, sizeof(ids), MPI_BYTE, world_size - 1, MPI_COMM_WORLD);
    ncclComm_t c1, c0;
    int r1 = world_size - 1 - world_rank, r0 = world_rank;   // (the root is rank 0 of c1, rank n-1 of c0)
    check(ncclCommInitRank(&c1, world_size, ids[1], r1) == ncclSuccess, "init with the second id");
    check(ncclCommInitRank(&c0, world_size, ids[0], r0) == ncclSuccess, "init with the first id");
    float x = (float)(world_rank + 1), y = 0.0f;
    int32_t v = world_rank, all[64];
    check(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, c0, stream_of(1)) == ncclSuccess, "two ids: all-reduce");
    check(ncclAllGather(&v, all, 1, ncclInt32, c1, stream_of(2)) == ncclSuccess, "two ids: all-gather");
    check(run_device(60), "two ids: the device finished");
    check(y == (float)(world_size * (world_size + 1) / 2), "two ids: all-reduce %g", y);
    int bad = 0;
    for (int q = 0; q < world_size; q++) { bad += all[q] != world_size - 1 - q; }   // (c1's rank q is world n-1-q)
    check(bad == 0, "two ids: all-gather in the communicator's rank order");
    check(ncclCommDestroy(c0) == ncclSuccess && ncclCommDestroy(c1) == ncclSuccess, "two ids: destroyed");
}

// ----------------------------------------------------------------------------
// errors, destroy and abort

static void test_errors(Comm world) {
    float x[8] = {0}, y[8] = {0};
    int n = world.size;
    check(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    check(ncclSend(x, 1, ncclFloat, n, world.nccl, stream_of(1)) == ncclInvalidArgument, "send to peer n");
    check(ncclRecv(x, 1, ncclFloat, -1, world.nccl, stream_of(1)) == ncclInvalidArgument, "recv from peer -1");
    check(ncclAllReduce(x, y, 1, ncclNumTypes, ncclSum, world.nccl, stream_of(1)) == ncclInvalidArgument, "bad type");
    check(ncclAllReduce(x, y, 1, ncclFloat8e4m3, ncclSum, world.nccl, stream_of(1)) == ncclInvalidArgument, "fp8");
    check(ncclAllReduce(x, y, 1, ncclFloat, ncclMax, world.nccl, stream_of(1)) == ncclInvalidArgument, "op max");
    check(ncclAllReduce(x, y, 1, ncclFloat, ncclSum, NULL, stream_of(1)) == ncclInvalidArgument, "NULL comm");
    check(ncclAllReduce(x, y, 1, ncclFloat, ncclSum, (ncclComm_t)x, stream_of(1)) == ncclInvalidArgument, "not a comm");
    check(ncclAllReduce(NULL, y, 1, ncclFloat, ncclSum, world.nccl, stream_of(1)) == ncclInvalidArgument, "NULL sendbuff");
    check(ncclAllGather(x, NULL, 1, ncclFloat, world.nccl, stream_of(1)) == ncclInvalidArgument, "NULL recvbuff");
    check(ncclReduceScatter(x, y, (size_t)-1 / 2, ncclFloat, ncclSum, world.nccl, stream_of(1)) == ncclInvalidArgument,
          "count that overflows");
    long before = items_queued;
    check(ncclAllReduce(x, y, 0, ncclFloat, ncclSum, world.nccl, stream_of(1)) == ncclSuccess && items_queued == before,
          "count 0: a no-op");
    check(ncclSend(NULL, 0, ncclFloat, 0, world.nccl, stream_of(1)) == ncclSuccess && items_queued == before,
          "send of 0 from NULL: a no-op");
    // a failing call inside a group: ncclGroupEnd returns its error and queues nothing
    check(ncclGroupStart() == ncclSuccess, "group start");
    check(ncclSend(x, 1, ncclFloat, 0, world.nccl, stream_of(1)) == ncclSuccess, "a good send in the group");
    check(ncclSend(x, 1, ncclFloat, n + 3, world.nccl, stream_of(1)) == ncclInvalidArgument, "a bad send in the group");
    check(ncclGroupEnd() == ncclInvalidArgument && items_queued == before, "the group's error, nothing queued");
    check(ncclGroupEnd() == ncclInvalidUsage, "the group ended");
    // ids and ranks (checked before any message)
    ncclComm_t c = NULL;
    ncclUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    check(ncclCommInitRank(&c, n, zero, world.rank) == ncclInvalidArgument, "an id not made by ncclGetUniqueId");
    ncclUniqueId id;
    check(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    check(ncclCommInitRank(&c, 2, id, 2) == ncclInvalidArgument, "rank 2 of 2");
    check(ncclCommInitRank(&c, 0, id, 0) == ncclInvalidArgument, "0 ranks");
    check(ncclCommInitRank(&c, world_size + 1, id, 0) == ncclInvalidArgument, "more ranks than the world");
    check(ncclCommInitRank(NULL, n, id, 0) == ncclInvalidArgument, "NULL comm pointer");
    check(ncclGetUniqueId(NULL) == ncclInvalidArgument, "ncclGetUniqueId(NULL)");
    ncclResult_t async = ncclInternalError;
    check(ncclCommGetAsyncError(world.nccl, &async) == ncclSuccess && async == ncclSuccess, "ncclCommGetAsyncError");
    check(strcmp(ncclGetErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)") == 0 &&
          strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0 && ncclGetErrorString((ncclResult_t)99) != NULL,
          "ncclGetErrorString");
    check(ncclCommDestroy(NULL) == ncclSuccess && ncclCommAbort(NULL) == ncclSuccess, "destroy and abort of NULL");
}

// An all-reduce queued, then the communicator destroyed before the device runs it: it still completes; later calls
// on the communicator are ncclInvalidUsage.
static void test_destroy_with_work(void) {
    Comm c = make_comm(0, world_rank);
    float x = (float)world_rank, y = -1.0f;
    check(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, c.nccl, stream_of(1)) == ncclSuccess, "destroy: call");
    check(ncclCommDestroy(c.nccl) == ncclSuccess, "destroy with a call queued");
    check(run_device(60), "destroy: the device finished");
    check(y == (float)(world_size * (world_size - 1) / 2), "destroy: the queued all-reduce completed (%g)", y);
    check(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, c.nccl, stream_of(1)) == ncclInvalidUsage, "all-reduce after destroy");
    check(ncclSend(&x, 1, ncclFloat, 0, c.nccl, stream_of(1)) == ncclInvalidUsage, "send after destroy");
    check(ncclCommDestroy(c.nccl) == ncclInvalidUsage, "destroy after destroy");
    check(ncclCommAbort(c.nccl) == ncclInvalidUsage, "abort after destroy");
    MPI_Comm_free(&c.mpi);
}

// A receive nobody sends, pending on the device; another thread aborts the communicator while the device steps it:
// the item ends, its buffer unwritten; later calls are ncclInvalidUsage. Then an abort with nothing pending.
static void test_abort(void) {
    Comm c = make_comm(0, world_rank);
    float buf[16];
    for (int i = 0; i < 16; i++) { buf[i] = 42.0f; }
    check(ncclRecv(buf, 16, ncclFloat, (c.rank + 1) % c.size, c.nccl, stream_of(2)) == ncclSuccess, "abort: recv");
    check(!run_device(0.3), "abort: the receive waits");
    ncclComm_t victim = c.nccl;
    std::thread aborter([victim]() {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        check(ncclCommAbort(victim) == ncclSuccess, "abort from another thread");
    });
    int finished = run_device(30);
    aborter.join();
    check(finished, "abort: the pending item ended");
    int untouched = 1;
    for (int i = 0; i < 16; i++) { untouched &= buf[i] == 42.0f; }
    check(untouched, "abort: the receive buffer unwritten");
    check(ncclRecv(buf, 16, ncclFloat, 0, c.nccl, stream_of(2)) == ncclInvalidUsage, "recv after abort");
    check(ncclCommDestroy(c.nccl) == ncclInvalidUsage, "destroy after abort");
    MPI_Comm_free(&c.mpi);
    Comm d = make_comm(0, world_rank);
    check(ncclCommAbort(d.nccl) == ncclSuccess, "abort with nothing pending");
    check(ncclAllGather(buf, buf, 0, ncclFloat, d.nccl, stream_of(1)) == ncclInvalidUsage, "all-gather after abort");
    MPI_Comm_free(&d.mpi);
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const char *seed = getenv("EMU_SEED");   // (the interleaving: the seed and the rank)
    rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(world_rank + 1) + (seed ? strtoull(seed, NULL, 10) : 0) * 0x2545f4914f6cdd1dull;
    if (rng_state == 0) { rng_state = 1; }
    check(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE");
    int n = world_size;

    Comm world = make_comm(0, world_rank);
    Comm parity = make_comm(world_rank % 2, world_rank);                          // evens and odds, at once
    Comm reversed = make_comm(0, n - 1 - world_rank);                             // root: world rank n-1
    Comm tail = make_comm(world_rank > 0 ? 0 : MPI_UNDEFINED, world_rank);        // rank 0 takes no part
    test_two_ids();

    size_t counts[4] = {1003, 2, 1, 5000};   // (2 and 1: fewer elements than ranks; 5000 floats: messages in pieces)
    for (int k = 0; k < 4; k++) {
        test_all_reduce(world, counts[k], 0, k, "world all-reduce");
        test_all_reduce(world, counts[k], 1, k + 10, "world all-reduce in place");
    }
    test_all_reduce(parity, 777, 0, 30, "parity all-reduce");
    test_all_reduce(reversed, 1001, 1, 31, "reversed all-reduce in place");
    test_all_reduce(tail, 999, 0, 32, "tail all-reduce");
    test_reduce_scatter(world, 333, 0, 40, "world reduce-scatter");
    test_reduce_scatter(world, 333, 1, 41, "world reduce-scatter in place");
    test_reduce_scatter(tail, 1, 1, 42, "tail reduce-scatter in place");
    test_reduce_scatter(reversed, 600, 0, 43, "reversed reduce-scatter");
    test_all_gather(world, 250, 0, "world all-gather");
    test_all_gather(world, 250, 1, "world all-gather in place");
    test_all_gather(parity, 3, 1, "parity all-gather in place");
    test_ring(world, 1, 1, "world ring");
    test_ring(world, 1, 2, "world ring over two streams");
    test_ring(parity, 0, 3, "parity ring");
    test_ring(tail, 2, 2, "tail ring");
    test_all_to_all(world, "world all-to-all");
    test_all_to_all(reversed, "reversed all-to-all");
    test_all_to_all(tail, "tail all-to-all");
    test_interleaved(world, reversed, parity);
    test_errors(world);
    test_destroy_with_work();
    test_abort();

    free_comm(&tail);
    free_comm(&reversed);
    free_comm(&parity);
    free_comm(&world);
    printf("rank %d: %d passed, %d failed\n", world_rank, passed, failed);
    fflush(stdout);
    MPI_Finalize();
    return failed > 0 ? 1 : 0;
}
