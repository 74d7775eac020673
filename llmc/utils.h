// Small helpers: fatal errors that never hang the other ranks, checked file I/O.
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include <errno.h>
#ifdef NO_MPI
#include "mpi_single.h"
#else
#include <mpi.h>
#endif

// A fatal error seen by one rank only (a bad file, a failed write): print one line and take
// every rank down with MPI_Abort, so the others never wait forever in a collective.
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    int initialized = 0, size = 1;
    MPI_Initialized(&initialized);
    if (initialized) { MPI_Comm_size(MPI_COMM_WORLD, &size); }
    if (initialized && size > 1) { MPI_Abort(MPI_COMM_WORLD, 1); }
    if (initialized) { MPI_Finalize(); }
    exit(1);
}

// A fatal error that every rank detects identically (a bad flag): rank 0 prints, all exit.
static void fail_all(int rank, const char *fmt, ...) {
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "error: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        fflush(stderr);
    }
    MPI_Finalize();
    exit(1);
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

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// File names: dir + "/" + a printf name, never truncated (-o is checked against PATH_LEN up front).
#define PATH_LEN 4096
static void path_join(char *out, const char *dir, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (snprintf(out, PATH_LEN, "%s/%s", dir, name) >= PATH_LEN) { fail("the path '%s/%s' is too long (at most %d bytes)", dir, name, PATH_LEN - 1); }
}

#endif
