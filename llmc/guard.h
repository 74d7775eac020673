// What keeps a run from failing silently or hanging, in one place:
//   crc32       zlib's CRC-32 (IEEE 802.3), of every byte after a file's 1024-byte header, kept in
//               header slot 255 of model and state files (0 = none: llm.c's files) and checked on load
//   watchdog    a thread that stops the rank when one communication op (a collective, a pipeline
//               exchange, a device synchronisation waiting on NCCL) makes no progress for --timeout
//               seconds: a stalled or dead peer. It only prints and _exits (MPI is not thread-multiple;
//               on CUDA it first aborts the NCCL communicators, NCCL's way out of a hung collective);
//               mpirun then takes the other ranks down.
//   signals     SIGUSR1 (mpirun forwards it to the ranks), SIGTERM and SIGINT ask for a stop: the ranks
//               agree at the next step boundary, write a checkpoint and exit 0. A second signal exits at once.
#ifndef LLMC_GUARD_H
#define LLMC_GUARD_H

#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>
#include "utils.h"

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

// The CRC of a file's bytes after its 1024-byte header (0 is kept for "none": a CRC of 0 becomes 1).
static uint32_t file_body_crc(FILE *f) {
    unsigned char buf[1 << 16];
    uint32_t crc = 0;
    size_t n;
    fseek(f, 1024, SEEK_SET);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { crc = crc32_update(crc, buf, n); }
    return crc ? crc : 1;
}

// Checks header slot 255 of an open file against its body; fails naming the file.
static void check_file_crc(FILE *f, const int *header, const char *path) {
    if (header[255] == 0) { return; }
    long here = ftell(f);
    uint32_t crc = file_body_crc(f);
    if (crc != (uint32_t)header[255]) {
        fail("file '%s' is corrupt: the CRC-32 of its body is %08x, its header says %08x", path, crc,
             (uint32_t)header[255]);
    }
    fseek(f, here, SEEK_SET);
}

// ----------------------------------------------------------------------------
// the watchdog

static volatile double watch_since = 0.0;     // when the current op began; 0: none
static const char *volatile watch_op = "";
static const char *volatile watch_group = "";
static double watch_timeout = 0.0;            // seconds; 0: off
static int watch_rank = 0;
static void (*watch_abort)(void) = NULL;      // called before exiting (CUDA: abort the NCCL communicators)

static double monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// Marks the start and the end of a communication op (ops do not nest: an inner one is the same wait).
static int watch_depth = 0;
static void watch_enter(const char *op, const char *group) {
    if (watch_depth++ == 0) { watch_op = op; watch_group = group; watch_since = monotonic_seconds(); }
}
static void watch_leave(void) {
    if (--watch_depth == 0) { watch_since = 0.0; }
}
// a blocking statement watched as one op
#define WATCHED(op, group, stmt) do { watch_enter(op, group); stmt; watch_leave(); } while (0)

static void *watchdog_thread(void *arg) {
    (void)arg;
    for (;;) {
        usleep(200 * 1000);
        double since = watch_since;
        if (since > 0.0 && monotonic_seconds() - since > watch_timeout) {
            char msg[512];
            int n = snprintf(msg, sizeof(msg),
                             "error: rank %d: no progress for %.0f s in %s on group %s (a stalled or dead rank, or a "
                             "deadlock; --timeout %.0f); stopping\n", watch_rank, monotonic_seconds() - since,
                                 watch_op, watch_group, watch_timeout);
            if (write(2, msg, n > 0 ? (size_t)n : 0) < 0) { /* nothing more to do */ }
            if (watch_abort) { watch_abort(); }
            _exit(1);
        }
    }
    return NULL;
}

static void watchdog_start(double timeout_seconds, int rank) {
    watch_timeout = timeout_seconds;
    watch_rank = rank;
    if (timeout_seconds <= 0.0) { return; }
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog_thread, NULL) != 0) { fail("cannot start the watchdog thread"); }
    pthread_detach(t);
}

// ----------------------------------------------------------------------------
// stop requests

static volatile sig_atomic_t stop_signal = 0;   // the first signal received, 0: none

static void stop_handler(int sig) {
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
}

static const char *signal_name(int sig) {
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
}

#endif
