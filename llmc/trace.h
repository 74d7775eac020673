// A per-rank timeline (--trace DIR): Chrome trace-event JSON, one file per rank (DIR/trace_RANK.json;
// dev/trace.py merges them into one file for Perfetto / chrome://tracing, one process row per rank, and
// draws the timeline). Spans: the forward and backward of each layer and micro-batch, the head, every
// collective (group, bytes), the pipeline exchanges, the optimizer step, checkpoint writes.
// Zero cost when off: every call returns at its first test.
// Clocks: CLOCK_MONOTONIC, zeroed at a barrier when tracing starts, so the ranks' rows line up.
// CPU build: a span is the host time between its two calls (the work runs in them).
// CUDA build: the device is never stopped for the trace. A span is two CUDA events: the begin on the compute
// stream (where its work was queued), the end on the stream that ran it (a collective's: its group's stream),
// resolved once a step (trace_flush, after the step's own wait) against an event recorded when the clocks were
// zeroed. Each stream is a row of the rank (tid 0 the compute stream, then each group's stream in order of first
// use), so a collective that overlaps compute shows beside it. Host work (checkpoint writes, "io") keeps host
// times, on a row of its own.
#ifndef LLMC_TRACE_H
#define LLMC_TRACE_H

#include <time.h>
#include <stdarg.h>
#include "backend.h"

#define TRACE_MAX_DEPTH 16

static FILE *trace_file = NULL;
static double trace_t0 = 0.0;
static int trace_rank = 0, trace_events = 0;
#ifndef USE_CUDA
static double trace_start_us[TRACE_MAX_DEPTH];   // (CUDA: events time the spans)
#endif
static int trace_depth = 0;

static double trace_now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec + t.tv_nsec / 1e9 - trace_t0) * 1e6;
}

// One event of the file: name, category, row, start and duration (us), optional arguments (a JSON object's body).
static void trace_write(const char *name, const char *cat, int tid, double start, double dur, const char *args) {
    if (trace_file == NULL) { return; }
    fprintf(trace_file, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", name,
            cat, trace_rank, tid, start, dur);
    if (args != NULL && args[0]) { fprintf(trace_file, ",\"args\":{%s}", args); }
    fprintf(trace_file, "}");
    trace_events++;
}

#ifdef USE_CUDA
// pending spans of this step: begin and end events from a pool made when tracing starts
#define TRACE_MAX_SPANS 4096
#define TRACE_MAX_ROWS 16
#define TRACE_HOST_ROW 99
typedef struct { const char *name, *cat; char args[192]; int tid, done; double host_start, host_end; } TraceSpan;
static TraceSpan *trace_spans = NULL;
static cudaEvent_t trace_ev_begin[TRACE_MAX_SPANS], trace_ev_end[TRACE_MAX_SPANS], trace_ev_zero;
static int trace_nspans = 0, trace_stack[TRACE_MAX_DEPTH];
static cudaStream_t trace_rows[TRACE_MAX_ROWS];
static int trace_nrows = 0;
static cudaStream_t trace_next_stream = NULL;   // the stream the next trace_end's work ran on (NULL: compute)
static const char *trace_next_label = NULL;

// the row of a stream (named in the file the first time it is seen)
static int trace_row(cudaStream_t s, const char *label) {
    for (int i = 0; i < trace_nrows; i++) { if (trace_rows[i] == s) { return i; } }
    if (trace_nrows == TRACE_MAX_ROWS) { return 0; }
    trace_rows[trace_nrows] = s;
    fprintf(trace_file, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s stream\"}}",
            trace_rank, trace_nrows, label);
    return trace_nrows++;
}

// Writes the spans closed so far (their events are waited for: after the step's own wait, a no-op).
static void trace_flush(void) {
    if (!trace_file || trace_nspans == 0) { return; }
    int keep = 0;
    for (int i = 0; i < trace_nspans; i++) {
        TraceSpan *s = &trace_spans[i];
        if (!s->done) { keep++; continue; }   // (a span still open: never, at a step's end)
        if (s->tid == TRACE_HOST_ROW) {
            trace_write(s->name, s->cat, s->tid, s->host_start, s->host_end - s->host_start, s->args);
            continue;
        }
        float b = 0.0f, e = 0.0f;
        cudaCheck(cudaEventSynchronize(trace_ev_end[i]));
        cudaCheck(cudaEventElapsedTime(&b, trace_ev_zero, trace_ev_begin[i]));
        cudaCheck(cudaEventElapsedTime(&e, trace_ev_zero, trace_ev_end[i]));
        trace_write(s->name, s->cat, s->tid, b * 1e3, (e - b) * 1e3, s->args);
    }
    if (keep == 0) { trace_nspans = 0; }
}
#else
static void trace_flush(void) {}
#endif

// The stream the next trace_end's work ran on, and its row's name (CUDA: a collective's group stream).
#ifdef USE_CUDA
static void trace_stream_next(cudaStream_t s, const char *label) { trace_next_stream = s; trace_next_label = label; }
#endif

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
#ifdef USE_CUDA
    trace_spans = (TraceSpan *)calloc_check(TRACE_MAX_SPANS, sizeof(TraceSpan));
    for (int i = 0; i < TRACE_MAX_SPANS; i++) {
        cudaCheck(cudaEventCreate(&trace_ev_begin[i]));
        cudaCheck(cudaEventCreate(&trace_ev_end[i]));
    }
    cudaCheck(cudaEventCreate(&trace_ev_zero));
    trace_row(main_stream, "compute");
#endif
    device_synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    trace_t0 = t.tv_sec + t.tv_nsec / 1e9;
#ifdef USE_CUDA
    cudaCheck(cudaEventRecord(trace_ev_zero, main_stream));
#endif
}

static void trace_close(void) {
    if (!trace_file) { return; }
    device_synchronize();
    trace_flush();
    fprintf(trace_file, "\n]}\n");
    fclose_check(trace_file, "the trace file");
    trace_file = NULL;
}

// A span opens; spans nest (the innermost closes first).
static void trace_begin(void) {
    if (!trace_file) { return; }
#ifdef USE_CUDA
    if (trace_nspans == TRACE_MAX_SPANS && trace_depth == 0) {   // (a step of more spans: it waits here once)
        device_synchronize();
        trace_flush();
    }
    if (trace_depth < TRACE_MAX_DEPTH) {
        int slot = trace_nspans < TRACE_MAX_SPANS ? trace_nspans++ : -1;   // (-1: past the pool, not recorded)
        trace_stack[trace_depth] = slot;
        if (slot >= 0) {
            trace_spans[slot].done = 0;
            trace_spans[slot].host_start = trace_now_us();
            cudaCheck(cudaEventRecord(trace_ev_begin[slot], main_stream));
        }
    }
#else
    if (trace_depth < TRACE_MAX_DEPTH) { trace_start_us[trace_depth] = trace_now_us(); }
#endif
    trace_depth++;
}

// The innermost span closes: its name, category and (optional) arguments, a JSON object's body such
// as "\"bytes\":1024" (printf format).
static void trace_endv(const char *name, const char *cat, const char *args_fmt, va_list ap) {
    if (!trace_file) { return; }
    char args[192] = "";
    if (args_fmt != NULL) { vsnprintf(args, sizeof(args), args_fmt, ap); }
    trace_depth--;
    if (trace_depth < 0 || trace_depth >= TRACE_MAX_DEPTH) { trace_depth = trace_depth < 0 ? 0 : trace_depth; return; }
#ifdef USE_CUDA
    cudaStream_t s = trace_next_stream ? trace_next_stream : main_stream;
    const char *label = trace_next_label ? trace_next_label : "compute";
    trace_next_stream = NULL;
    trace_next_label = NULL;
    int slot = trace_stack[trace_depth];
    if (slot < 0) { return; }
    TraceSpan *sp = &trace_spans[slot];
    sp->name = name;
    sp->cat = cat;
    snprintf(sp->args, sizeof(sp->args), "%s", args);
    sp->host_end = trace_now_us();
    sp->tid = !strcmp(cat, "io") ? TRACE_HOST_ROW : trace_row(s, label);
    cudaCheck(cudaEventRecord(trace_ev_end[slot], s));
    sp->done = 1;
#else
    double end = trace_now_us(), start = trace_start_us[trace_depth];
    trace_write(name, cat, 0, start, end - start, args);
#endif
}

static void trace_end(const char *name, const char *cat, const char *args_fmt, ...) {
    va_list ap;
    va_start(ap, args_fmt);
    trace_endv(name, cat, args_fmt, ap);
    va_end(ap);
}

#endif
