// Small helpers: fatal errors that never hang the other ranks, checked allocations and file I/O.
// The error rule: every error is one line "error: ..." and a non-zero exit, by one of two calls:
//   fail(...)          this rank alone found it (a bad file, a failed write, a bug): MPI_Abort takes every
//                      rank down, so none waits forever in a collective;
//   fail_all(rank,...) every rank reached the same decision (a flag, a layout, a shape: checked alike on
//                      every rank, or agreed in a collective): rank 0 prints, every rank exits after
//                      MPI_Finalize; stop_all(code) is its form for when each rank printed its own line.
// Two threads may not call MPI (it is initialised single-threaded): the asynchronous checkpoint writer
// records its error and the main thread fails with it at the next step boundary (checkpoint_mark_done);
// the watchdog (guard.h) prints its line and _exit(1)s, which mpirun turns into the job's end.
// Every wait on another rank is watched (watch_enter / watch_leave below, the watchdog in guard.h), MPI_Init
// and MPI_Finalize included: no rank waits forever on a stalled one. Every call to other ranks is recorded
// (flight_recorder.h), and a hang, an MPI error or a failed rank is diagnosed from the records (flight_diagnosis.h,
// called from guard.h: the watchdog, and the MPI error handler installed by mpi_init_watched).
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include <errno.h>
#include <time.h>
#ifdef NO_MPI
#include "mpi_single.h"
#else
#include <mpi.h>
#endif
#include "flight_recorder.h"

// ----------------------------------------------------------------------------
// the watched op: what this rank is waiting for and since when (the watchdog thread of guard.h reads it)

static volatile double watch_since = 0.0;     // when the current op began; 0: none
static const char *volatile watch_op = "";
static const char *volatile watch_group = "";

static double monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// Marks the start and the end of a wait on other ranks (ops do not nest: an inner one is the same wait).
static int watch_depth = 0;
static void watch_enter(const char *op, const char *group) {
    if (watch_depth++ == 0) { watch_op = op; watch_group = group; watch_since = monotonic_seconds(); }
}
static void watch_leave(void) {
    if (--watch_depth == 0) { watch_since = 0.0; }
}
// a blocking statement watched as one op
#define WATCHED(op, group, stmt) do { watch_enter(op, group); stmt; watch_leave(); } while (0)

// MPI_Finalize waits for every rank: watched, so a rank that stalls after its work cannot hang the others
// (they exit 1 after --timeout, their work done); recorded, and the recording ends there (flight_finish).
static void mpi_finalize_watched(void) {
    flight_at(PH_END, -1, FL_LAYER_NONE);
    uint64_t id = flight_post(flight.world, FL_FINALIZE, -1, 0, 0, 0, 0);
    WATCHED("MPI_Finalize", "world", MPI_Finalize());
    flight_done(id);
    flight_finish();
}

// MPI_Init. The emulated device's NCCL (llmc/emu/nccl.h) makes its MPI calls on the device's thread beside the
// host's, so that build asks for MPI_THREAD_MULTIPLE (the Makefile's MPI_THREAD_LEVEL).
static int mpi_init(int *argc, char ***argv) {
#if defined(MPI_THREAD_LEVEL) && !defined(NO_MPI)
    int provided;
    return MPI_Init_thread(argc, argv, MPI_THREAD_LEVEL, &provided);
#else
    return MPI_Init(argc, argv);
#endif
}

// ----------------------------------------------------------------------------
// A fatal error seen by one rank only (a bad file, a failed write): print one line and take
// every rank down with MPI_Abort, so the others never wait forever in a collective.
static void print_error(const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    flight_end(FL_FAILED, msg);
}

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    int initialized = 0, size = 1;
    MPI_Initialized(&initialized);
    if (initialized) { MPI_Comm_size(MPI_COMM_WORLD, &size); }
    if (initialized && size > 1) { MPI_Abort(MPI_COMM_WORLD, 1); }
    if (initialized) { mpi_finalize_watched(); }
    exit(1);
}

// A fatal error that every rank detects identically (a bad flag): rank 0 prints, all exit.
static void stop_all(int code) {
    mpi_finalize_watched();
    exit(code);
}

static void fail_all(int rank, const char *fmt, ...) {
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        print_error(fmt, ap);
        va_end(ap);
    }
    flight_end(FL_FAILED, "a decision of every rank (rank 0 printed it)");
    stop_all(1);
}

static FILE *fopen_check(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (f == NULL) { fail("cannot open file '%s' (mode %s)", path, mode); }
    return f;
}

static void fread_check(void *ptr, size_t size, size_t n, FILE *f, const char *path) {
    size_t got = fread(ptr, size, n, f);
    if (got != n) { fail("file '%s' is truncated: expected %zu more items of %zu bytes, got %zu", path, n, size, got); }
}

static void fwrite_check(const void *ptr, size_t size, size_t n, FILE *f, const char *path) {
    if (fwrite(ptr, size, n, f) != n) { fail("cannot write to '%s' (disk full?)", path); }
}

static void fclose_check(FILE *f, const char *path) {
    if (fclose(f) != 0) { fail("cannot close '%s'", path); }
}

static long file_size(FILE *f) {
    long here = ftell(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, here, SEEK_SET);
    return size;
}

static void *malloc_check(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) { fail("out of host memory allocating %zu bytes", bytes); }
    return p;
}

static void *calloc_check(size_t n, size_t size) {
    void *p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
    if (p == NULL) { fail("out of host memory allocating %zu x %zu bytes", n, size); }
    return p;
}

static void *realloc_check(void *old, size_t bytes) {
    void *p = realloc(old, bytes > 0 ? bytes : 1);
    if (p == NULL) { fail("out of host memory allocating %zu bytes", bytes); }
    return p;
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// File names: dir + "/" + a printf name, never truncated (-o is checked against PATH_LEN up front).
#define PATH_LEN 4096
static void path_join(char *out, const char *dir, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (snprintf(out, PATH_LEN, "%s/%s", dir, name) >= PATH_LEN) {
        fail("the path '%s/%s' is too long (at most %d bytes)", dir, name, PATH_LEN - 1);
    }
}

#endif
