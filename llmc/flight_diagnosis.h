// The diagnosis of a hang or a disagreement, from the rings of a job's ranks (flight_recorder.h): one line, starting
// "diagnosis:", that names the rank, the group and the call, and says what the other ranks were doing.
//   read  each rank's ring: in the run directory (DIR/flight/) or the job's temporary folder, and this rank's own; a
//         rank whose ring is not there (on another node, without a shared -o) is named as unknown
//   see   per rank: the call it waits in (its oldest blocking call not complete, else its oldest call not
//         complete), its newest complete call, whether its process runs (on this host /proc says running, stopped
//         or gone; elsewhere its heartbeat), how it ended, the signal it got, its file work (rank 0's checkpoint write)
//   find  (1) the earliest call two ranks made differently (under one number: a collective's operation, count or
//         type; a message's size or kind), and whether one rank's calls are the others' shifted by one (it skipped
//         one); else (2) from the rank whose waiting call was posted first, whom it waits for: a collective waits for
//         the members that have not posted its number (CUDA: or whose device is still in an earlier call), a receive
//         for a peer that sent fewer, a send for one that received fewer. The chain ends at a rank in no call, stopped or gone (the cause), or comes back to a rank
//         it passed (a deadlock: a call skipped, calls made in different orders, a send without its receive);
//         (3) else a stopped or vanished rank
// Printed by the first rank to time out (guard.h), by a rank that meets an MPI error (utils.h's handler), by rank 0
// when its checkpoint write stops progressing (run_dir.h), and from a run directory by dev/flight.sh; the words
// of a disagreement also by --check-collectives (comm.h).
#ifndef LLMC_FLIGHT_DIAGNOSIS_H
#define LLMC_FLIGHT_DIAGNOSIS_H

#include <stdarg.h>
#include "flight_recorder.h"

enum { FD_RUNNING, FD_STOPPED, FD_GONE, FD_SILENT, FD_UNKNOWN };   // a rank's process

typedef struct {
    int present;             // its ring was read
    FlightHeader h;
    FlightRecord *rec;       // its records, oldest first
    int n;
    int wait;                // the call it waits in (an index into rec), -1: none
    int last;                // its newest complete call, -1: none
    int state;               // FD_*
} RankRing;

typedef struct {
    int world;
    RankRing *r;             // (world)
    int me;                  // the rank diagnosing (-1: dev/flight.sh)
    int live;                // the job runs (times are said as "ago"; after it, before each rank's last sign of life)
    char host[64];
} Rings;

// A line being written: appended to, never past its end.
typedef struct { char *s; size_t n, len; } Line;
static void fd_put(Line *l, const char *fmt, ...) {
    if (l->len + 1 >= l->n) { return; }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->s + l->len, l->n - l->len, fmt, ap);
    va_end(ap);
    if (k > 0) { l->len = l->len + (size_t)k < l->n ? l->len + (size_t)k : l->n - 1; }
}

// ----------------------------------------------------------------------------
// reading the rings

// Why the last ring was not read ("": it was, or it is another job's).
static char fd_why[160];

// What is wrong with a ring's header (NULL: nothing): the layout this reader knows, 0 <= rank < world <=
// FLIGHT_MAX_WORLD, each group's place inside its size and its size inside the world.
static const char *fd_header_problem(const FlightHeader *h, size_t len) {
    if (memcmp(h->magic, FLIGHT_MAGIC, 8) != 0) { return "not a ring of the flight recorder (magic)"; }
    if (h->version != FLIGHT_VERSION || h->header_bytes != FLIGHT_HEADER_BYTES || h->record_bytes != (int)sizeof(FlightRecord)) {
        return "another version or layout of the ring";
    }
    if (h->capacity <= 0 || h->capacity > (1 << 24) || len < flight_bytes(h->capacity)) { return "its capacity does not match its size"; }
    if (h->world < 1 || h->world > FLIGHT_MAX_WORLD || h->rank < 0 || h->rank >= h->world) {
        return "its rank and world are not 0 <= rank < world <= 65536";
    }
    if (h->ngroups < 0 || h->ngroups > FLIGHT_GROUPS || h->end < FL_RUNNING || h->end > FL_FINISHED) {
        return "its group count or its end is out of range";
    }
    for (int g = 0; g < h->ngroups; g++) {
        const FlightGroup *x = &h->groups[g];
        if (x->size < 1 || x->size > h->world || x->rank < 0 || x->rank >= x->size || x->instance < 0 ||
            x->instance >= h->world) {
            return "a group's size, place or instance is out of range";
        }
    }
    return NULL;
}

// A ring from the bytes of its file (of this job, unless job is NULL): its valid records, oldest first. 0 and
// fd_why set when the header is not one this reader can trust (another job's ring: 0, fd_why "").
static int fd_parse(const char *buf, size_t len, const char *job, RankRing *out) {
    FlightHeader *h = &out->h;
    fd_why[0] = '\0';
    if (len < sizeof(FlightHeader)) { snprintf(fd_why, sizeof(fd_why), "%zu bytes: shorter than a header", len); return 0; }
    memcpy(h, buf, sizeof(*h));
    const char *problem = fd_header_problem(h, len);
    if (problem) { snprintf(fd_why, sizeof(fd_why), "%s", problem); return 0; }
    if (job && strncmp(h->job, job, sizeof(h->job)) != 0) { return 0; }
    h->host[sizeof(h->host) - 1] = h->job[sizeof(h->job) - 1] = h->why[sizeof(h->why) - 1] = '\0';   // (its words
    h->io_what[sizeof(h->io_what) - 1] = h->diagnosis[sizeof(h->diagnosis) - 1] = '\0';                //  ended)
    for (int g = 0; g < h->ngroups; g++) { h->groups[g].name[sizeof(h->groups[g].name) - 1] = '\0'; }
    uint64_t cap = (uint64_t)h->capacity, end = h->written, i = end > cap ? end - cap : 0;
    out->rec = (FlightRecord *)malloc((size_t)cap * sizeof(FlightRecord));
    out->n = 0;
    for (; out->rec && i < end; i++) {   // (a slot being rewritten holds another index: skipped)
        FlightRecord x;
        memcpy(&x, buf + FLIGHT_HEADER_BYTES + (i % cap) * sizeof(FlightRecord), sizeof(x));
        if (x.index == i && x.group >= 1 && (int)x.group <= h->ngroups && x.op < FL_NOPS && x.peer >= -1 &&
            x.peer < h->world) {
            out->rec[out->n++] = x;
        }
    }
    out->present = out->rec != NULL;
    return out->present;
}

// A ring file (a regular file, opened without blocking: a FIFO there never hangs the reader); 0 and fd_why if not.
static int fd_read(const char *path, const char *job, RankRing *out) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    fd_why[0] = '\0';
    if (fd < 0) { snprintf(fd_why, sizeof(fd_why), "cannot open it: %s", strerror(errno)); return 0; }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) {
        snprintf(fd_why, sizeof(fd_why), "not a regular file of at most 64 MiB");
        close(fd);
        return 0;
    }
    char *buf = (char *)malloc((size_t)st.st_size + 1);
    ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
    close(fd);
    int ok = got == st.st_size && fd_parse(buf, (size_t)got, job, out);
    free(buf);
    return ok;
}

// Its process: on this host as /proc has it; elsewhere by its heartbeat (beaten 5 times a second).
static int fd_process(const FlightHeader *h, const char *host) {
    if (!strncmp(h->host, host, sizeof(h->host))) {
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)h->pid);
        FILE *f = fopen(path, "r");
        if (f == NULL) { return FD_GONE; }
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        char s = p && p[1] && p[2] ? p[2] : '?';
        return s == 'T' || s == 't' ? FD_STOPPED : s == 'Z' || s == 'X' ? FD_GONE : FD_RUNNING;
    }
    if (h->heartbeat == 0.0) { return FD_UNKNOWN; }
    return flight_clock() - h->heartbeat > 2.0 ? FD_SILENT : FD_RUNNING;
}

// The call a rank waits in: its oldest blocking call not complete (an exchange waits for its receives, then its
// sends), else its oldest call not complete (an asynchronous one not waited for yet, or CUDA's: the device's
// order); and its newest complete call.
static void fd_waits(RankRing *r) {
    int blocking = -1, oldest = -1;
    r->last = -1;
    for (int i = 0; i < r->n; i++) {
        const FlightRecord *x = &r->rec[i];
        if (x->done != 0.0) { if (r->last < 0 || x->done >= r->rec[r->last].done) { r->last = i; } continue; }
        if (oldest < 0) { oldest = i; }
        if (blocking < 0 && !(x->flags & (FL_ASYNC | FL_DEVICE))) { blocking = i; }
    }
    r->wait = blocking >= 0 ? blocking : oldest;
}

static void fd_free(Rings *rs) {
    for (int i = 0; i < rs->world; i++) { free(rs->r[i].rec); }
    free(rs->r);
    rs->r = NULL;
}

// Every rank's view, once its ring is read (rs->r[i].present).
static void fd_look(Rings *rs) {
    for (int i = 0; i < rs->world; i++) {
        RankRing *r = &rs->r[i];
        if (!r->present) { continue; }
        fd_waits(r);
        r->state = fd_process(&r->h, rs->host);
    }
}

// ----------------------------------------------------------------------------
// words

static void fd_size(Line *l, double bytes) {
    static const char *units[4] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 3) { bytes /= 1024.0; u++; }
    if (u == 0 || bytes == (double)(long)bytes) { fd_put(l, "%.0f %s", bytes, units[u]); }
    else { fd_put(l, "%.2f %s", bytes, units[u]); }
}

static void fd_layer(Line *l, int layer) {
    if (layer >= 0) { fd_put(l, "layer %d", layer); }
    else if (layer == FL_LAYER_EMBEDDING) { fd_put(l, "the embedding"); }
    else if (layer == FL_LAYER_HEAD) { fd_put(l, "the head"); }
}

// What a call belongs to, inside the brackets: "micro-batch 2, layer 1 backward", "optimizer", "set-up"
static void fd_belongs(Line *l, const FlightContext *c) {
    int phase = c->phase >= 0 && c->phase < PH_N ? c->phase : PH_SETUP;
    int pass = phase == PH_FORWARD || phase == PH_BACKWARD || phase == PH_WEIGHTS;
    if (pass && c->micro >= 0) { fd_put(l, "micro-batch %d, ", c->micro); }
    if (pass) {
        fd_layer(l, c->layer);
        fd_put(l, "%s%s", c->layer != FL_LAYER_NONE ? " " : "", flight_phase_names[phase]);
        return;
    }
    fd_put(l, "%s", flight_phase_names[phase]);
    if (phase == PH_EVAL && c->layer != FL_LAYER_NONE) { fd_put(l, ", "); fd_layer(l, c->layer); }
}

// " of step 3 (micro-batch 2, layer 1 backward)", " of step 3 (optimizer)", " (set-up)"
static void fd_context(Line *l, const FlightContext *c) {
    if (c->step >= 0) { fd_put(l, " of step %d", c->step); }
    fd_put(l, " (");
    fd_belongs(l, c);
    fd_put(l, ")");
}

static const FlightGroup *fd_group(const RankRing *r, const FlightRecord *x) { return &r->h.groups[x->group - 1]; }

// "dp all-reduce #5 of step 1 (...)", "pp send #3 to rank 1 (...)", "MPI_Init"
static void fd_call(Line *l, const RankRing *r, const FlightRecord *x) {
    if (x->op == FL_INIT || x->op == FL_FINALIZE) { fd_put(l, "%s", flight_op_names[x->op]); return; }
    fd_put(l, "%s %s #%u", fd_group(r, x)->name, flight_op_names[x->op], x->seq);
    if (flight_is_message(x->op)) { fd_put(l, " %s rank %d", x->op == FL_SEND ? "to" : "from", x->peer); }
    fd_context(l, &x->ctx);
}

// This rank's own record of id in words, as fd_call says it (the watchdog's line: guard.h); "a device call" if the
// ring no longer holds it.
static void fd_own_call(char *out, size_t n, uint64_t id) {
    static RankRing me;   // (the watchdog's thread only: the header is too large for its stack's comfort)
    Line l = {out, n, 0};
    out[0] = '\0';
    FlightRecord *x = id ? flight_slot(id - 1) : NULL;
    FlightRecord copy;
    if (x) { memcpy(&copy, x, sizeof(copy)); }
    if (x == NULL || copy.index != id - 1 || copy.group < 1 || (int)copy.group > flight_header()->ngroups ||
        copy.op >= FL_NOPS) {
        fd_put(&l, "a device call");
        return;
    }
    memcpy(&me.h, flight_header(), sizeof(me.h));
    fd_call(&l, &me, &copy);
}

// "rank 1", "ranks 0,2-3"
static void fd_ranks(Line *l, const int *ranks, int n) {
    fd_put(l, n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) { j++; }
        fd_put(l, "%s%d", i ? "," : "", ranks[i]);
        if (j > i) { fd_put(l, "-%d", ranks[j]); }
        i = j;
    }
}

// The newest sign of a rank's life: its heartbeat, its end, its signal, its last call.
static double fd_last_sign(const RankRing *r) {
    double t = r->h.heartbeat > r->h.ended ? r->h.heartbeat : r->h.ended;
    if (r->h.signalled > t) { t = r->h.signalled; }
    for (int i = 0; i < r->n; i++) {
        if (r->rec[i].posted > t) { t = r->rec[i].posted; }
        if (r->rec[i].done > t) { t = r->rec[i].done; }
    }
    return t;
}

// What a rank is: its process, the call it is in (or none), its last complete call, its file work, its end.
// live: times are said as "ago", else before the rank's last sign of life (a job over).
static void fd_state(Line *l, const RankRing *r, int live) {
    const FlightHeader *h = &r->h;
    double end = live ? flight_clock() : fd_last_sign(r);
    const char *when = live ? "ago" : "before its last sign of life";
    if (r->state == FD_STOPPED) { fd_put(l, "is stopped (process state T: SIGSTOP?)"); }
    else if (r->state == FD_GONE && h->end == FL_RUNNING && h->signal == 0) {
        fd_put(l, "is gone (its process ended without a mark: killed -9, or crashed)");
    }
    else if (r->state == FD_GONE && h->end == FL_RUNNING) {
        fd_put(l, "was ended by %s (the launcher?)", h->signal == SIGTERM ? "SIGTERM" : h->signal == SIGINT ? "SIGINT"
               : h->signal == SIGHUP ? "SIGHUP" : h->signal == SIGUSR1 ? "SIGUSR1" : "a signal");
    }
    else if (r->state == FD_GONE) { fd_put(l, "has ended (%s)", flight_end_names[h->end]); }
    else if (r->state == FD_SILENT) {
        fd_put(l, "is silent (no heartbeat for %.0f s: stopped, or its node down)", flight_clock() - h->heartbeat);
    }
    else { fd_put(l, "runs"); }
    if (r->wait >= 0) { fd_put(l, " in "); fd_call(l, r, &r->rec[r->wait]); }
    else { fd_put(l, ", outside any call"); }
    if (h->io_what[0]) { fd_put(l, " (%s has made no progress for %.1f s)", h->io_what, end - h->io_since); }
    if (r->last >= 0) {
        fd_put(l, ", its last complete call ");
        fd_call(l, r, &r->rec[r->last]);
        fd_put(l, " %.1f s %s", end - r->rec[r->last].done, when);
    } else if (r->n == 0) {
        int phase = h->now.phase >= 0 && h->now.phase < PH_N ? h->now.phase : PH_SETUP;
        fd_put(l, ", and has made none yet (%s)", flight_phase_names[phase]);
    }
}

// A rank in a few words, for the others' summary: the call it waits in, or its state.
static void fd_brief(Line *l, const RankRing *r, int live) {
    if (r->wait >= 0 && (r->state == FD_RUNNING || r->state == FD_UNKNOWN)) {
        fd_put(l, "waits in ");
        fd_call(l, r, &r->rec[r->wait]);
    } else {
        fd_state(l, r, live);
    }
}

// ----------------------------------------------------------------------------
// (1) a call made differently

static int fd_same_group(const FlightGroup *a, const FlightGroup *b) {
    return a->instance == b->instance && !strncmp(a->name, b->name, sizeof(a->name));
}
static const FlightGroup *fd_find_group(const RankRing *r, const FlightGroup *g) {
    for (int i = 0; i < r->h.ngroups; i++) { if (fd_same_group(&r->h.groups[i], g)) { return &r->h.groups[i]; } }
    return NULL;
}

// Rank r's record of collective `seq` of group g, or of its message `seq` (op) with world rank peer; NULL if its
// ring does not hold it.
static const FlightRecord *fd_find(const RankRing *r, const FlightGroup *g, int op, int peer, uint32_t seq) {
    for (int i = r->n - 1; i >= 0; i--) {
        const FlightRecord *x = &r->rec[i];
        int message = flight_is_message(x->op);
        if (x->seq != seq || message != flight_is_message(op) || !fd_same_group(fd_group(r, x), g)) { continue; }
        if (!message || (x->op == op && x->peer == peer)) { return x; }
    }
    return NULL;
}

// The highest number among rank r's messages (op) of group g with world rank peer in its ring: 0 if it made none,
// -1 if its ring holds none but no longer holds its oldest calls either (unknown).
static int64_t fd_messages(const RankRing *r, const FlightGroup *g, int op, int peer) {
    int64_t most = r->h.written > (uint64_t)r->h.capacity ? -1 : 0;
    for (int i = 0; i < r->n; i++) {
        const FlightRecord *x = &r->rec[i];
        if (x->op == op && x->peer == peer && x->seq > most && fd_same_group(fd_group(r, x), g)) { most = x->seq; }
    }
    return most;
}

// Whether two ranks' records of one call differ: a collective's operation, type or count (an all-to-all's counts
// differ by rank), a message's size or kind (the sender's and the receiver's).
static int fd_differ(const FlightRecord *x, const FlightRecord *y) {
    if (flight_is_message(x->op)) { return x->count * x->elem != y->count * y->elem || x->tag != y->tag; }
    return x->op != y->op || x->type != y->type || (x->op != FL_ALL_TO_ALL && x->count != y->count);
}
static int fd_same_context(const FlightContext *a, const FlightContext *b) {
    return a->step == b->step && a->micro == b->micro && a->layer == b->layer && a->phase == b->phase;
}

// "ranks disagree on tp all-gather #7 of step 0 (...): ranks 0,2-3 8 KiB, rank 1 4 KiB": the members' records of one
// collective (ranks ascending), sorted into kinds (operation, bytes, type), the largest kind first. Also what
// --check-collectives prints (comm.h). Returns the index of the first record of the largest kind.
static int fd_disagree_line(Line *l, const char *group, const int *ranks, const FlightRecord *x, int n) {
    int *kind = (int *)calloc(n + 1, sizeof(int)), *count = (int *)calloc(n + 1, sizeof(int));
    int *in = (int *)calloc(n + 1, sizeof(int)), nk = 0, ops = 0, types = 0;
    if (!kind || !count || !in) { free(kind); free(count); free(in); return 0; }
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < i && (kind[k] != k || fd_differ(&x[k], &x[i]))) { k++; }
        kind[i] = k == i ? i : kind[k];
        count[kind[i]]++;
        nk += kind[i] == i;
        ops |= x[i].op != x[0].op;
        types |= x[i].type != x[0].type;
    }
    int big = 0, contexts = 0;   // (contexts: the kinds' contexts differ; else the call's is said once)
    for (int i = 1; i < n; i++) {
        if (count[i] > count[big]) { big = i; }
        contexts |= !fd_same_context(&x[i].ctx, &x[0].ctx);
    }
    fd_put(l, "ranks disagree on %s %s #%u", group, flight_op_names[x[big].op], x[big].seq);
    if (!contexts) { fd_context(l, &x[big].ctx); }
    else if (x[big].ctx.step >= 0) { fd_put(l, " of step %d", x[big].ctx.step); }
    fd_put(l, ":");
    for (int pass = 0; pass < 2; pass++) {   // the largest kind, then the others in rank order
        for (int k = 0; k < n; k++) {
            if (kind[k] != k || (pass == 0) != (k == big)) { continue; }
            int m = 0;
            for (int i = 0; i < n; i++) { if (kind[i] == k) { in[m++] = ranks[i]; } }
            fd_put(l, " ");
            fd_ranks(l, in, m);
            if (ops) { fd_put(l, " %s", flight_op_names[x[k].op]); }
            fd_put(l, " ");
            fd_size(l, (double)x[k].count * x[k].elem);
            if (types) { fd_put(l, " (type %d)", x[k].type); }
            if (contexts && x[k].ctx.step != x[big].ctx.step) { fd_put(l, " of step %d", x[k].ctx.step); }
            if (contexts) { fd_put(l, " ("); fd_belongs(l, &x[k].ctx); fd_put(l, ")"); }
            if (nk > 1) { fd_put(l, ","); }
        }
    }
    if (l->len > 0 && l->s[l->len - 1] == ',') { l->s[--l->len] = '\0'; }
    free(kind); free(count); free(in);
    return big;
}

// Whether rank b's record y (number s) is rank a's number s + 1 (the same call, the same context): b skipped a's
// number s.
static int fd_shifted(const RankRing *a, const FlightGroup *g, const FlightRecord *y) {
    const FlightRecord *z = fd_find(a, g, y->op, -1, y->seq + 1);
    return z && !fd_differ(z, y) && fd_same_context(&z->ctx, &y->ctx);
}

// The earliest collective two members recorded differently: its members' records, and whether one rank's calls
// are the others' shifted by one.
static int fd_collective_disagreement(Rings *rs, Line *l) {
    const RankRing *best_r = NULL;
    const FlightRecord *best = NULL;
    for (int a = 0; a < rs->world; a++) {
        const RankRing *A = &rs->r[a];
        for (int i = 0; A->present && i < A->n; i++) {
            const FlightRecord *x = &A->rec[i];
            if (flight_is_message(x->op) || (best && x->posted >= best->posted)) { continue; }
            for (int b = 0; b < rs->world; b++) {
                const FlightRecord *y = b == a || !rs->r[b].present ? NULL
                                      : fd_find(&rs->r[b], fd_group(A, x), x->op, -1, x->seq);
                if (y && fd_differ(x, y)) { best = x; best_r = A; break; }
            }
        }
    }
    if (best == NULL) { return 0; }
    const FlightGroup *g = fd_group(best_r, best);
    int *ranks = (int *)malloc(rs->world * sizeof(int)), n = 0;
    FlightRecord *x = (FlightRecord *)malloc(rs->world * sizeof(FlightRecord));
    if (!ranks || !x) { free(ranks); free(x); return 0; }
    for (int b = 0; b < rs->world; b++) {
        const FlightRecord *y = rs->r[b].present ? fd_find(&rs->r[b], g, best->op, -1, best->seq) : NULL;
        if (y) { ranks[n] = b; x[n++] = *y; }
    }
    int big = fd_disagree_line(l, g->name, ranks, x, n);
    for (int i = 0; i < n; i++) {   // a rank one call behind: it skipped the others' number s
        if (fd_differ(&x[i], &x[big]) && fd_shifted(&rs->r[ranks[big]], g, &x[i])) {
            fd_put(l, ": rank %d skipped %s %s #%u", ranks[i], g->name, flight_op_names[x[big].op], x[big].seq);
            fd_context(l, &x[big].ctx);
            fd_put(l, " (its #%u is %s #%u)", x[i].seq, n > 2 ? "the others'" : "the other's", x[i].seq + 1);
            break;
        }
        if (fd_differ(&x[i], &x[big]) && fd_shifted(&rs->r[ranks[i]], g, &x[big])) {
            fd_put(l, ": rank %d made a call the others did not (its #%u is the others' #%u)", ranks[i], x[big].seq + 1,
                   x[big].seq);
            break;
        }
    }
    free(ranks); free(x);
    return 1;
}

// The earliest message whose sender and receiver recorded it differently (size or kind).
static int fd_message_disagreement(Rings *rs, Line *l) {
    for (int a = 0; a < rs->world; a++) {
        const RankRing *A = &rs->r[a];
        for (int i = 0; A->present && i < A->n; i++) {
            const FlightRecord *x = &A->rec[i];
            if (x->op != FL_SEND || x->peer < 0 || x->peer >= rs->world || !rs->r[x->peer].present) { continue; }
            const FlightRecord *y = fd_find(&rs->r[x->peer], fd_group(A, x), FL_RECV, a, x->seq);
            if (y == NULL || !fd_differ(x, y)) { continue; }
            fd_put(l, "ranks %d and %d disagree on %s message #%u from rank %d to rank %d: sent as ", a, x->peer,
                   fd_group(A, x)->name, x->seq, a, x->peer);
            fd_size(l, (double)x->count * x->elem);
            fd_put(l, " of kind %d", x->tag);
            fd_context(l, &x->ctx);
            fd_put(l, ", received as ");
            fd_size(l, (double)y->count * y->elem);
            fd_put(l, " of kind %d", y->tag);
            fd_context(l, &y->ctx);
            return 1;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// (2) who waits for whom

// Whether rank r posted call seq of group g to its device (a collective: op, peer -1; a message: op, with world rank
// peer), but its device has not reached it: its oldest call not complete is a device call (CUDA) made before it.
// (NCCL starts a rank's calls in the order the host posted them, NCCL_LAUNCH_ORDER_IMPLICIT across communicators:
// backend.h. A CUDA rank's host runs ahead of its device, so having posted a call is not having entered it.)
static int fd_device_behind(const RankRing *r, const FlightGroup *g, int op, int peer, uint32_t seq) {
    if (r->wait < 0 || !(r->rec[r->wait].flags & FL_DEVICE)) { return 0; }
    const FlightRecord *y = fd_find(r, g, op, peer, seq);
    return y != NULL && y->done == 0.0 && r->rec[r->wait].index < y->index;
}

// The highest number among rank r's messages (op) of group g with world rank peer seen complete in its ring (0: none).
static uint32_t fd_messages_done(const RankRing *r, const FlightGroup *g, int op, int peer) {
    uint32_t most = 0;
    for (int i = 0; i < r->n; i++) {
        const FlightRecord *x = &r->rec[i];
        if (x->op == op && x->peer == peer && x->done != 0.0 && x->seq > most && fd_same_group(fd_group(r, x), g)) {
            most = x->seq;
        }
    }
    return most;
}

// The ranks rank a's waiting call waits for (have: how many of the call's kind each has posted; a message's peer
// whose device is behind: how many it completed); *unknown: members whose rings were not read. A call waits for the
// members (the peer) that have not posted it, or whose device has not reached it (fd_device_behind).
static int fd_blockers(const Rings *rs, int a, int *out, uint32_t *have, int *unknown) {
    const RankRing *A = &rs->r[a];
    const FlightRecord *x = &A->rec[A->wait];
    const FlightGroup *g = fd_group(A, x);
    int n = 0, members = 1;
    *unknown = 0;
    if (flight_is_message(x->op)) {
        int p = x->peer, other = x->op == FL_SEND ? FL_RECV : FL_SEND;
        if (p < 0 || p >= rs->world || !rs->r[p].present) { *unknown = 1; return 0; }
        const FlightGroup *gp = fd_find_group(&rs->r[p], g);
        int64_t got = gp ? fd_messages(&rs->r[p], gp, other, a) : 0;
        if (got < 0) { *unknown = 1; }
        else if (got < x->seq) { out[n] = p; have[n++] = (uint32_t)got; }
        else if (fd_device_behind(&rs->r[p], gp, other, a, x->seq)) {
            out[n] = p;
            have[n++] = fd_messages_done(&rs->r[p], gp, other, a);
        }
        return n;
    }
    for (int m = 0; m < rs->world; m++) {
        const FlightGroup *gm = m != a && rs->r[m].present ? fd_find_group(&rs->r[m], g) : NULL;
        if (gm == NULL) { continue; }
        members++;
        if (gm->posted < x->seq || fd_device_behind(&rs->r[m], gm, FL_ALL_REDUCE, -1, x->seq)) {
            out[n] = m;
            have[n++] = gm->posted;
        }
    }
    *unknown = g->size > members ? g->size - members : 0;
    return n;
}

// Whether a rank is a cause by itself: stopped, silent, or gone without having waited (killed -9, crashed, failed
// with its own error). A rank its watchdog, an MPI error or the launcher's signal ended was waiting: its ring still
// says in what.
static int fd_stuck(const RankRing *r) {
    int waited = r->h.end == FL_TIMED_OUT || r->h.end == FL_MPI_ERROR || (r->h.end == FL_RUNNING && r->h.signal != 0);
    return r->state == FD_STOPPED || r->state == FD_SILENT ||
           (r->state == FD_GONE && !waited && r->h.end != FL_FINISHED);
}

// The next rank on fd_chain's path (path: np ranks) among the nb blockers of its last rank (have: what each has
// posted or received): one already on the path (a deadlock: *cycle set), else one in no call (a cause), else the
// first. *got: what the next one has.
static int fd_next_on_chain(const Rings *rs, const int *path, int np, const int *blockers, const uint32_t *have,
                            int nb, uint32_t *got, int *cycle) {
    int next = blockers[0];
    *cycle = 0;
    *got = have[0];
    for (int i = 0; i < nb; i++) {
        int on_path = 0;
        for (int j = 0; j < np; j++) { on_path |= path[j] == blockers[i]; }
        if (on_path || (!*cycle && rs->r[blockers[i]].wait < 0)) {
            next = blockers[i];
            *got = have[i];
            *cycle = on_path;
        }
        if (*cycle) { break; }
    }
    return next;
}

// One link of fd_chain's line: rank a (np-th on the path) waits in its call A->rec[A->wait], for the nb blockers
// (a message: its peer, which has got; a collective: the ranks that never entered it). Returns whether the next
// rank is to be named "it" (a collective's single blocker).
static int fd_say_link(Line *l, const RankRing *A, int a, int np, int pronoun, const int *blockers, int nb,
                       uint32_t got, int *said) {
    const FlightRecord *x = &A->rec[A->wait];
    int message = flight_is_message(x->op);
    if (np == 1 && !message) {
        fd_ranks(l, blockers, nb);
        fd_put(l, " never entered ");
        fd_call(l, A, x);
        pronoun = nb == 1;
    } else {
        if (np == 1) { fd_put(l, "rank %d waits in ", a); }
        else if (pronoun) { fd_put(l, ": it waits in "); }
        else { fd_put(l, ": rank %d waits in ", a); }
        fd_call(l, A, x);
        said[a] = 1;
        if (message) { fd_put(l, ", which %s %u", x->op == FL_SEND ? "received" : "sent", got); }
        else { fd_put(l, ", which "); fd_ranks(l, blockers, nb); fd_put(l, " never entered"); }
        pronoun = !message && nb == 1;
    }
    return pronoun;
}

// From rank start's waiting call, whom it waits for, and so on: the cause at the chain's end (a rank in no call,
// stopped or gone), or a deadlock (the chain comes back to a rank). 0 if the chain names no one (every member of
// start's call posted it). "it" is the rank just named as the one that never entered a call; after a message, its
// peer is named.
static int fd_chain(const Rings *rs, int start, Line *l, int *said) {
    enum { MAX_PATH = 64, MAX_BLOCKERS = 4096 };
    static int blockers[MAX_BLOCKERS];
    static uint32_t have[MAX_BLOCKERS];
    int path[MAX_PATH], np = 0, pronoun = 0;
    path[np++] = start;
    for (;;) {
        int a = path[np - 1], unknown = 0;
        const RankRing *A = &rs->r[a];
        if (np > 1 && (A->wait < 0 || fd_stuck(A))) {   // the cause
            if (pronoun) { fd_put(l, ": it "); } else { fd_put(l, ": rank %d ", a); }
            fd_state(l, A, rs->live);
            said[a] = 1;
            return 1;
        }
        if (A->wait < 0 || rs->world > MAX_BLOCKERS) { return 0; }
        int nb = fd_blockers(rs, a, blockers, have, &unknown);
        const FlightRecord *x = &A->rec[A->wait];
        if (nb == 0) {   // every member posted a's call (or some could not be read)
            if (np == 1) { return 0; }
            if (pronoun) { fd_put(l, ": it waits in "); } else { fd_put(l, ": rank %d waits in ", a); }
            fd_call(l, A, x);
            said[a] = 1;
            if (unknown) { fd_put(l, ", with %d member%s whose ring was not found", unknown, unknown > 1 ? "s" : ""); }
            else { fd_put(l, ", which every member posted"); }
            return 1;
        }
        // the next rank: one already on the chain (a deadlock), else one in no call (a cause), else the first
        int cycle;
        uint32_t got;
        int next = fd_next_on_chain(rs, path, np, blockers, have, nb, &got, &cycle);
        pronoun = fd_say_link(l, A, a, np, pronoun, blockers, nb, got, said);
        if (cycle) {
            fd_put(l, ": a deadlock, these ranks wait on each other (a call skipped, calls made in different orders, "
                      "or a send without its receive)");
            return 1;
        }
        if (np == MAX_PATH) { return 1; }
        path[np++] = next;
    }
}

// ----------------------------------------------------------------------------
// the line

// A brief (it starts with its verb) for one rank, or for several (the verb's plural).
static void fd_verb(Line *l, const char *brief, int plural) {
    static const char *const one[5] = {"waits ", "runs ", "is ", "has ", "was "};
    static const char *const many[5] = {"wait ", "run ", "are ", "have ", "were "};
    for (int i = 0; plural && i < 5; i++) {
        size_t k = strlen(one[i]);
        if (!strncmp(brief, one[i], k)) { fd_put(l, "%s%s", many[i], brief + k); return; }
    }
    fd_put(l, "%s", brief);
}

// What the ranks not named yet are doing, ranks alike together: "; ranks 2-3 wait in tp all-reduce #40 (...)".
static void fd_others(const Rings *rs, Line *l, const int *said) {
    enum { BRIEF = 512 };
    size_t world = rs->world > 0 ? (size_t)rs->world : 1;
    char *text = (char *)calloc(world, BRIEF);
    int *ranks = (int *)malloc(world * sizeof(int)), missing = 0;
    if (!text || !ranks) { free(text); free(ranks); return; }
    for (int r = 0; r < rs->world; r++) {
        Line b = {text + (size_t)r * BRIEF, BRIEF, 0};
        if (rs->r[r].present && !said[r]) { fd_brief(&b, &rs->r[r], rs->live); }
        missing += !rs->r[r].present;
    }
    for (int r = 0; r < rs->world; r++) {
        const char *t = text + (size_t)r * BRIEF;
        if (!t[0]) { continue; }
        int n = 0;
        for (int q = r; q < rs->world; q++) {
            char *u = text + (size_t)q * BRIEF;
            if (u[0] && !strcmp(u, t)) { ranks[n++] = q; if (q > r) { u[0] = '\0'; } }
        }
        fd_put(l, "; ");
        fd_ranks(l, ranks, n);
        fd_put(l, " ");
        fd_verb(l, t, n > 1);
    }
    if (missing) {
        int n = 0;
        for (int r = 0; r < rs->world; r++) { if (!rs->r[r].present) { ranks[n++] = r; } }
        fd_put(l, "; no ring found for ");
        fd_ranks(l, ranks, n);
        fd_put(l, " (another node, without a shared -o?)");
    }
    free(text); free(ranks);
}

// The rank to start from: the running rank whose waiting call was posted first (the oldest call left hanging; a
// deadlock's line then reads the same whichever rank prints it), else any waiting rank.
static int fd_start(const Rings *rs) {
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        for (int r = 0; r < rs->world; r++) {
            const RankRing *R = &rs->r[r];
            if (!R->present || R->wait < 0 || (!pass && fd_stuck(R))) { continue; }
            if (best < 0 || R->rec[R->wait].posted < rs->r[best].rec[rs->r[best].wait].posted) { best = r; }
        }
    }
    return best;
}

// (3) The first rank that stopped or vanished, if any: stopped, then gone without a mark (killed or crashed; of
// several, the one whose last sign of life came first), then silent.
static int fd_vanished(const Rings *rs) {
    int best = -1;
    for (int r = 0; r < rs->world; r++) {
        const RankRing *R = &rs->r[r];
        if (!R->present) { continue; }
        int rank_of = R->state == FD_STOPPED ? 3 : R->state == FD_GONE && R->h.end == FL_RUNNING && R->h.signal == 0 ? 2
                    : R->state == FD_SILENT ? 1 : 0;
        if (rank_of == 0) { continue; }
        if (best < 0) { best = r; continue; }
        const RankRing *B = &rs->r[best];
        int best_of = B->state == FD_STOPPED ? 3 : B->state == FD_GONE ? 2 : 1;
        if (rank_of > best_of || (rank_of == best_of && fd_last_sign(R) < fd_last_sign(B))) { best = r; }
    }
    return best;
}

// The diagnosis of the rings in rs (read, and looked at: fd_look), into out.
static void fd_diagnose(Rings *rs, char *out, size_t n) {
    Line l = {out, n, 0};
    out[0] = '\0';
    int *said = (int *)calloc(rs->world + 1, sizeof(int));
    if (said == NULL) { return; }
    int start = fd_start(rs), gone = fd_vanished(rs);
    if (fd_collective_disagreement(rs, &l) || fd_message_disagreement(rs, &l)) {   // (the others: what each does)
    } else if (start >= 0 && fd_chain(rs, start, &l, said)) {
    } else if (gone >= 0) {
        fd_put(&l, "rank %d ", gone);
        fd_state(&l, &rs->r[gone], rs->live);
        said[gone] = 1;
    } else if (start >= 0) {
        const RankRing *S = &rs->r[start];
        fd_put(&l, "every member of rank %d's call is in it: rank %d waits in ", start, start);
        fd_call(&l, S, &S->rec[S->wait]);
        fd_put(&l, ", which every member posted (a hang inside MPI or NCCL, the network, or a device?)");
        said[start] = 1;
    } else {
        int finished = 1, any = 0;
        for (int r = 0; r < rs->world; r++) {
            if (rs->r[r].present) { any = 1; finished &= rs->r[r].h.end == FL_FINISHED; }
        }
        fd_put(&l, !any ? "no ring was found" : finished ? "every rank finished (MPI_Finalize)"
                                                          : "no rank waits in a call");
        if (finished) { for (int r = 0; r < rs->world; r++) { said[r] |= rs->r[r].present; } }
    }
    fd_others(rs, &l, said);
    free(said);
}

// ----------------------------------------------------------------------------
// the job's rings, read by one of its ranks (the live diagnosis)

// Rank r's ring: this rank's own, or another's from the run directory or the job's temporary folder.
static void fd_read_rank(Rings *rs, int r) {
    RankRing *R = &rs->r[r];
    const FlightHeader *mine = flight_header();
    char path[FLIGHT_PATH];
    if (r == rs->me && flight.base) {   // (read from memory: it may have no file)
        fd_parse(flight.base, flight_bytes(mine->capacity), NULL, R);
        return;
    }
    const char *dirs[2] = {flight.run_dir, flight.job_dir};
    for (int d = 0; d < 2 && !R->present; d++) {
        if (dirs[d][0] && flight_ring_name(path, sizeof(path), dirs[d], r) && fd_read(path, mine->job, R) &&
            (R->h.rank != r || R->h.world != rs->world)) {   // (another rank's or another world's: not this one's)
            free(R->rec);
            memset(R, 0, sizeof(*R));
        }
    }
}

// Reads the rings of this rank's job, as far as they can be found.
static int fd_load_job(Rings *rs) {
    const FlightHeader *mine = flight_header();
    memset(rs, 0, sizeof(*rs));
    rs->me = mine->rank;
    rs->live = 1;
    rs->world = mine->world > rs->me ? mine->world : rs->me + 1;
    gethostname(rs->host, sizeof(rs->host) - 1);
    rs->r = (RankRing *)calloc(rs->world, sizeof(RankRing));
    if (rs->r == NULL) { return 0; }
    for (int r = 0; r < rs->world; r++) { fd_read_rank(rs, r); }
    fd_look(rs);
    return 1;
}

// Whether this rank is the first of the job to have ended abnormally (the earliest mark among the rings read; ties:
// the lowest rank): the one that prints.
static int fd_first(const Rings *rs) {
    int first = -1;
    for (int r = 0; r < rs->world; r++) {
        const FlightHeader *h = &rs->r[r].h;
        if (!rs->r[r].present || h->end == FL_RUNNING || h->end == FL_FINISHED) { continue; }
        if (first < 0 || h->ended < rs->r[first].h.ended) { first = r; }
    }
    return first < 0 || first == rs->me;
}

// This rank has marked its ring's end (flight_end): after a moment (a rank ending at the same time marks its ring
// too), the first rank to have ended prints the diagnosis line on stderr, in one write.
static void flight_report(void) {
    Rings rs;
    usleep(300 * 1000);
    flight_poll();
    if (!fd_load_job(&rs)) { return; }
    if (fd_first(&rs)) {
        char line[2048];
        memcpy(line, "diagnosis: ", 11);
        fd_diagnose(&rs, line + 11, sizeof(line) - 12);
        FlightHeader *h = flight_header();   // (kept in the ring: dev/flight.sh prints it first)
        snprintf(h->diagnosis, sizeof(h->diagnosis), "%s", line + 11);
        if (flight.fd >= 0) { msync(flight.base, flight_bytes(h->capacity), MS_ASYNC); }
        size_t n = strlen(line);
        line[n++] = '\n';
        if (write(2, line, n) < 0) { /* nothing more to do */ }
    } else {
        usleep(1000 * 1000);   // (the first rank prints meanwhile: this rank's exit makes mpirun end the job)
    }
    fd_free(&rs);
}

#endif // LLMC_FLIGHT_DIAGNOSIS_H
