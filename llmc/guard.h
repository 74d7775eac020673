// What keeps a run from failing silently or hanging, in one place:
//   crc32       zlib's CRC-32 (IEEE 802.3) of a model or state file's header and body, kept in header slot
//               255 (0 = none: llm.c's files; slot 254 says what it covers) and checked on load
//   watchdog    a thread, started before MPI_Init with the flight recorder, that stops the rank when one wait on
//               other ranks (MPI_Init, a collective, a pipeline exchange, a device synchronisation waiting on NCCL,
//               a checkpoint write's progress, MPI_Finalize) makes no progress for --timeout seconds: a stalled or
//               dead peer. It only prints, marks the rank's ring, lets the first rank to time out print the
//               diagnosis from the rings (flight_diagnosis.h) and _exits (MPI is not thread-multiple; on CUDA it
//               first aborts the NCCL communicators, NCCL's way out of a hung collective); mpirun then takes the
//               other ranks down. Meanwhile it beats the ring's heartbeat (a stopped rank's stops).
//   signals     SIGUSR1 (mpirun forwards it to the ranks), SIGTERM, SIGINT and SIGHUP ask for a stop: the
//               ranks agree at the next step boundary, write a checkpoint and exit 0. A second signal exits at once.
#ifndef LLMC_GUARD_H
#define LLMC_GUARD_H

#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>
#include "utils.h"
#include "flight_diagnosis.h"

// ----------------------------------------------------------------------------
// MPI_Init watched and recorded; MPI errors diagnosed

// An MPI error on any communicator (every one is split from the world, whose handler it inherits): the error line
// naming the call (the watched op), the ring marked, the diagnosis (comm.h's records show who called what: a
// mismatched collective is what Open MPI reports as MPI_ERR_TRUNCATE), and every rank taken down.
static void mpi_error_handler(MPI_Comm *comm, int *code, ...) {
    (void)comm;
    char text[MPI_MAX_ERROR_STRING] = "", msg[1024];
    int len = 0, rank = 0;
    MPI_Error_string(*code, text, &len);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(msg, sizeof(msg), "rank %d: MPI error in %s on group %s: %s", rank, watch_op[0] ? watch_op : "a call",
             watch_group[0] ? watch_group : "?", text);
    fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    flight_end(FL_MPI_ERROR, msg);
    flight_report();
    MPI_Abort(MPI_COMM_WORLD, 1);
}

// MPI_Init, watched (a rank stalled before it cannot hang the others) and recorded as the world's first call;
// then MPI errors go to mpi_error_handler.
static void mpi_init_watched(int *argc, char ***argv) {
    uint64_t id = flight_post(flight.world, FL_INIT, -1, 0, 0, 0, 0);
    WATCHED("MPI_Init", "world", mpi_init(argc, argv));
    flight_done(id);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    flight_rank(rank, world);
    MPI_Errhandler handler;
    MPI_Comm_create_errhandler(mpi_error_handler, &handler);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
}

// ----------------------------------------------------------------------------
// crc32

static uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) { c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) { crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8); }
    return ~crc;
}

// Header slot 254 says what the CRC in slot 255 covers: 1, the header (slot 255 read as 0) and the body;
// 0 (files of older versions of this program), the body alone. Slot 255 = 0: no CRC (llm.c's files).
#define CRC_SCOPE_SLOT 254
#define CRC_SCOPE_HEADER_AND_BODY 1

// The CRC a file with this header and body must carry (0 is kept for "none": a CRC of 0 becomes 1):
// start with crc_begin(header), add the body's bytes with crc32_update, end with crc_end.
static uint32_t crc_begin(const int *header) {
    int h[256];
    memcpy(h, header, sizeof(h));
    h[255] = 0;
    return h[CRC_SCOPE_SLOT] == CRC_SCOPE_HEADER_AND_BODY ? crc32_update(0, h, sizeof(h)) : 0;
}
static uint32_t crc_end(uint32_t crc) { return crc ? crc : 1; }

// Pieces of file I/O done (bumped by whatever reads or writes a checkpoint, on any thread): how rank 0 shows
// the others that a long read or write progresses (run_dir.h's rank0_wait_done).
static volatile long io_progress = 0;

// The CRC of an open file (its header given) as crc_begin / crc_end define it.
static uint32_t file_crc(FILE *f, const int *header) {
    unsigned char buf[1 << 16];
    uint32_t crc = crc_begin(header);
    size_t n;
    fseek(f, 1024, SEEK_SET);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { crc = crc32_update(crc, buf, n); io_progress++; }
    return crc_end(crc);
}

// Checks header slot 255 of an open file against its header and body; fails naming the file.
static void check_file_crc(FILE *f, const int *header, const char *path) {
    if (header[255] == 0) { return; }
    if (header[CRC_SCOPE_SLOT] != 0 && header[CRC_SCOPE_SLOT] != CRC_SCOPE_HEADER_AND_BODY) {
        fail("file '%s' is corrupt: header slot %d is %d, expected 0 or %d (what its CRC covers)", path, CRC_SCOPE_SLOT,
             header[CRC_SCOPE_SLOT], CRC_SCOPE_HEADER_AND_BODY);
    }
    long here = ftell(f);
    uint32_t crc = file_crc(f, header);
    if (crc != (uint32_t)header[255]) {
        fail("file '%s' is corrupt: the CRC-32 of its %s is %08x, its header says %08x", path,
             header[CRC_SCOPE_SLOT] ? "header and body" : "body", crc, (uint32_t)header[255]);
    }
    fseek(f, here, SEEK_SET);
}

// ----------------------------------------------------------------------------
// the watchdog (the watched op itself, watch_enter / watch_leave, is in utils.h)

#define DEFAULT_TIMEOUT 600.0                 // --timeout's default (args.h)
static double watch_timeout = 0.0;            // seconds; 0: off
static int watch_rank = -1;                   // -1: not known yet (before MPI_Init, without a launcher's rank)
static void (*watch_abort)(void) = NULL;      // called before exiting (CUDA: abort the NCCL communicators)

// The NCCL communicators' abort may itself hang (a communicator's cudaFree waiting for another one's kernel that
// still spins, resources freed in step with a peer that is stopped: NVIDIA/nccl issues 549, 564, 992, 1777): it runs
// after the diagnosis is out, and the rank exits WATCH_ABORT_SECONDS later whether or not it returned.
#define WATCH_ABORT_SECONDS 10
static void *watch_abort_deadline(void *arg) {
    (void)arg;
    sleep(WATCH_ABORT_SECONDS);
    static const char msg[] = "error: the NCCL communicators' abort has not returned in 10 s: exiting without it\n";
    if (write(2, msg, sizeof(msg) - 1) < 0) { /* nothing more to do */ }
    _exit(1);
    return NULL;
}

// A stop for no progress: the line (msg, "error: ..."), the ring's end, the diagnosis, the communicators aborted.
static void watchdog_stop(const char *msg) {
    if (write(2, msg, strlen(msg)) < 0) { /* nothing more to do */ }
    flight_end(FL_TIMED_OUT, msg + 7);   // (without "error: ")
    flight_report();
    if (watch_abort) {
        pthread_t t;
        if (pthread_create(&t, NULL, watch_abort_deadline, NULL) == 0) { pthread_detach(t); }
        watch_abort();
    }
    _exit(1);
}

// Two tests, 5 times a second: (1) the watched op (a wait on other ranks: a collective, an exchange, a device
// synchronisation) has lasted --timeout; (2) CUDA: the host thread has been blocked for --timeout outside a watched
// op behind a device call (a collective) that has not completed (flight_device_stall: a wait the code does not
// watch, so that an unwatched blocking call cannot hang the rank for good).
static void *watchdog_thread(void *arg) {
    (void)arg;
    for (;;) {
        usleep(200 * 1000);
        flight_beat();
        double since = watch_since, stalled = 0.0;
        char msg[1024], who[32] = "?";
        if (watch_rank >= 0) { snprintf(who, sizeof(who), "%d", watch_rank); }
        if (since > 0.0 && monotonic_seconds() - since > watch_timeout) {
            snprintf(msg, sizeof(msg),
                     "error: rank %s: no progress for %.0f s in %s on group %s (a stalled or dead rank, or a "
                     "deadlock; --timeout %.0f); stopping\n", who, monotonic_seconds() - since, watch_op,
                     watch_group, watch_timeout);
            watchdog_stop(msg);
        }
        uint64_t id = since > 0.0 ? 0 : flight_device_stall(&stalled);
        if (id && stalled > watch_timeout) {
            char call[512];
            fd_own_call(call, sizeof(call), id);
            snprintf(msg, sizeof(msg),
                     "error: rank %s: no progress for %.0f s: the host waits outside any watched op behind %s, which "
                     "has not completed on the device (a stalled or dead rank, or a deadlock; --timeout %.0f); "
                     "stopping\n", who, stalled, call, watch_timeout);
            watchdog_stop(msg);
        }
    }
    return NULL;
}

// Starts the watchdog and the flight recorder before MPI_Init, so that a rank stalled before it, or an init that
// never completes, cannot hang the others, and is diagnosed: --timeout is read from argv as parse_args will read
// it (a bad value: the default here, and parse_args' error later); the rank is the launcher's until MPI says
// (watchdog_rank).
static void watchdog_start(int argc, char **argv) {
    watch_timeout = DEFAULT_TIMEOUT;
    for (int i = 1; i + 1 < argc; i++) {
        char *end;
        double t = strtod(argv[i + 1], &end);
        if (!strcmp(argv[i], "--timeout") && *end == '\0' && end != argv[i + 1] && t >= 0.0) { watch_timeout = t; }
    }
    const char *r = getenv("OMPI_COMM_WORLD_RANK"), *w = getenv("OMPI_COMM_WORLD_SIZE");
    if (r == NULL) { r = getenv("PMIX_RANK"); }
    if (r == NULL) { r = getenv("SLURM_PROCID"); }   // (srun)
    if (w == NULL) { w = getenv("PMI_SIZE"); }
    if (w == NULL) { w = getenv("SLURM_NTASKS"); }
    watch_rank = r ? atoi(r) : -1;
    flight_start(watch_rank, w ? atoi(w) : 1, watch_timeout);
    if (watch_timeout <= 0.0) { return; }
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog_thread, NULL) != 0) { fail("cannot start the watchdog thread"); }
    pthread_detach(t);
}

static void watchdog_rank(int rank) { watch_rank = rank; }

// ----------------------------------------------------------------------------
// divergence: an update is skipped (like a non-finite one, global_norm.h, and counted against --max-skips)
// when its loss is above the fixed bound 2 ln V (a uniform guess costs ln V: no healthy run gets near twice
// that), or (llm.c's -sl z, -sg z; 0 off) when its loss or gradient norm is more than z standard
// deviations above the mean of the last OUTLIER_WINDOW applied updates'. The limits for a step come from the
// steps before it, so the device decides before AdamW without waiting on the host. The window starts
// empty, and again after a resume (it is not in the checkpoint): until it is full only the fixed bound holds.

#define OUTLIER_WINDOW 128
typedef struct { double v[OUTLIER_WINDOW]; int n, next; } Outlier;

static void outlier_add(Outlier *o, double x) {
    o->v[o->next] = x;
    o->next = (o->next + 1) % OUTLIER_WINDOW;
    if (o->n < OUTLIER_WINDOW) { o->n++; }
}

// mean + z * std of the window (+inf while it is not full, or z = 0)
static float outlier_limit(const Outlier *o, float z) {
    if (z <= 0.0f || o->n < OUTLIER_WINDOW) { return INFINITY; }
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < OUTLIER_WINDOW; i++) { sum += o->v[i]; }
    double mean = sum / OUTLIER_WINDOW;
    for (int i = 0; i < OUTLIER_WINDOW; i++) { sq += (o->v[i] - mean) * (o->v[i] - mean); }
    return (float)(mean + z * sqrt(sq / OUTLIER_WINDOW));
}

// ----------------------------------------------------------------------------
// stop requests

static volatile sig_atomic_t stop_signal = 0;   // the first signal received, 0: none

static void stop_handler(int sig) {
    flight_signal(sig);                          // (mpirun ends a job with SIGTERM: the ring says so)
    if (stop_signal) { _exit(128 + sig); }       // the second one: now
    stop_signal = sig;
}

static void signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stop_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static const char *signal_name(int sig) {
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP"
                                                                                                : "a signal";
}

#endif
