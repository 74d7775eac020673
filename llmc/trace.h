// A per-rank timeline (--trace DIR): Chrome trace-event JSON, one file per rank (DIR/trace_RANK.json;
// dev/trace.py merges them into one file for Perfetto / chrome://tracing, one process row per rank, and
// draws the timeline). Spans: the forward and backward of each layer and micro-batch, the head, every
// collective (group, bytes), the pipeline exchanges, the optimizer step, checkpoint writes.
// Zero cost when off: every call returns at its first test. On CUDA a span synchronises the device at
// both ends while tracing (host timestamps of queued work would mean nothing), so a traced run is slower.
// Clocks: CLOCK_MONOTONIC, zeroed at a barrier when tracing starts, so the ranks' rows line up.
#ifndef LLMC_TRACE_H
#define LLMC_TRACE_H

#include <time.h>
#include "backend.h"

#define TRACE_MAX_DEPTH 16

static FILE *trace_file = NULL;
static double trace_t0 = 0.0;
static int trace_rank = 0, trace_events = 0;
static double trace_start_us[TRACE_MAX_DEPTH];
static int trace_depth = 0;

static double trace_now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec + t.tv_nsec / 1e9 - trace_t0) * 1e6;
}

// Every rank: opens DIR/trace_RANK.json (dir NULL: tracing stays off). Collective (a barrier).
static void trace_open(const char *dir, int rank) {
    if (dir == NULL) { return; }
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/trace_%d.json", dir, rank) >= (int)sizeof(path)) {
        fail("--trace '%s': the path is too long", dir);
    }
    trace_file = fopen_check(path, "w");
    trace_rank = rank;
    fprintf(trace_file,
            "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    device_synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    trace_t0 = t.tv_sec + t.tv_nsec / 1e9;
}

static void trace_close(void) {
    if (!trace_file) { return; }
    fprintf(trace_file, "\n]}\n");
    fclose_check(trace_file, "the trace file");
    trace_file = NULL;
}

// A span opens; spans nest (the innermost closes first).
static void trace_begin(void) {
    if (!trace_file) { return; }
    device_synchronize();
    if (trace_depth < TRACE_MAX_DEPTH) { trace_start_us[trace_depth] = trace_now_us(); }
    trace_depth++;
}

// The innermost span closes: its name, category and (optional) arguments, a JSON object's body such
// as "\"bytes\":1024" (printf format).
static void trace_end(const char *name, const char *cat, const char *args_fmt, ...) {
    if (!trace_file) { return; }
    device_synchronize();
    double end = trace_now_us();
    trace_depth--;
    if (trace_depth < 0 || trace_depth >= TRACE_MAX_DEPTH) { trace_depth = trace_depth < 0 ? 0 : trace_depth; return; }
    double start = trace_start_us[trace_depth];
    fprintf(trace_file,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f", name, cat,
            trace_rank, start, end - start);
    if (args_fmt != NULL) {
        va_list ap;
        va_start(ap, args_fmt);
        fprintf(trace_file, ",\"args\":{");
        vfprintf(trace_file, args_fmt, ap);
        fprintf(trace_file, "}");
        va_end(ap);
    }
    fprintf(trace_file, "}");
    trace_events++;
}

#endif
