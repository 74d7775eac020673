// A span: one piece of the step's work as the three instruments see it, opened by one call and closed by one.
// - the flight recorder: the layer the rank is in (a hang's diagnosis names it: flight_recorder.h);
// - the trace: a span on --trace-dir's timeline, with its name, category and arguments (trace.h);
// - the cost clock, when timed (--comm-report with a pipeline): the seconds between open and close, the device
//   synchronised at both ends, added to one of the step's costs (pipeline_costs.txt, --pp-layers auto).
#ifndef LLMC_SPAN_H
#define LLMC_SPAN_H

#include <limits.h>
#include <stdarg.h>
#include "utils.h"
#include "backend.h"
#include "flight_recorder.h"
#include "trace.h"

#define SPAN_SAME_LAYER INT_MIN   // span_open's layer: the flight recorder's layer stays as it is

typedef struct {
    const char *name, *cat;   // the trace span's (name NULL: none, the span is the flight recorder's and the clock's)
    int timed;                // the cost clock runs
    double t0;
} Span;

static Span span_open(int layer, int timed, const char *name, const char *cat) {
    if (layer != SPAN_SAME_LAYER) { flight_layer(layer); }
    Span s = {name, cat, timed, 0.0};
    if (timed) { device_synchronize(); s.t0 = monotonic_seconds(); }
    if (name) { trace_begin(); }
    return s;
}

// The span closes: the trace's arguments (a JSON object's body, printf format; NULL: none); its seconds are
// added to *seconds when it was timed (seconds NULL: not counted).
static void span_close(Span s, double *seconds, const char *args_fmt, ...) {
    if (s.name) {
        va_list ap;
        va_start(ap, args_fmt);
        trace_endv(s.name, s.cat, args_fmt, ap);
        va_end(ap);
    }
    if (s.timed && seconds) { device_synchronize(); *seconds += monotonic_seconds() - s.t0; }
}

#endif
