// The run directory (-o): its checkpoints (checkpoint.h writes and reads one), its lock, its identity, retention,
// unusable/ and main.log. It is one run's alone (a lock), its main.log is trimmed on resume to what an
// uninterrupted run would have written, and every file in it is written whole or not at all. A run has an
// identity, fixed at its fresh start and kept by its resumes, that main.log's first line and every state
// file record: a fresh run (-y 0) refuses a directory holding another run's checkpoints (--overwrite deletes
// them), a resume continues only the run main.log records, and retention (-nk) counts and deletes only this
// run's intact checkpoints. A resume moves the unusable checkpoints it passed over into DIR/unusable/.
#ifndef LLMC_RUN_DIR_H
#define LLMC_RUN_DIR_H

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <dirent.h>
#include <pthread.h>
#include "utils.h"
#include "guard.h"
#include "comm.h"
#include "test_hooks.h"

// The state file's header (checkpoint.h writes the file): its version, its slots, the run's identity
#define STATE_MAGIC 20240527
// 3: the CRC covers the header; the model file's CRC and the data's fingerprint; the run's identity (slots
// SH_RUN_LO/HI, 0 in the files of older versions of 3, which recorded none)
#define STATE_VERSION 3
enum { SH_STEP = 2, SH_UPDATES, SH_SKIPS, SH_T, SH_BATCH, SH_EPOCH, SH_SHARD, SH_SHUFFLE, SH_MASTER, SH_PARAMS_LO, SH_PARAMS_HI,
       SH_RNG_LO = 15, SH_RNG_HI, SH_NSHARDS, SH_SKIPS_IN_A_ROW,
       SH_TP = 20, SH_PP, SH_DP, SH_EP, SH_ZERO, SH_MAX_STEPS, SH_MODEL_CRC, SH_DATA_FP, SH_RUN_LO, SH_RUN_HI,
       SH_OPTIMIZER, SH_CRC = 255 };   // SH_OPTIMIZER: 1 Muon (muon.h), 0 AdamW

// The identity of the run in -o (every rank): a fresh run's comes from args_run_id (a hash of the flags that
// define what it trains, and of its data: the same run gives the same bytes), a resumed run's from its
// checkpoint. 0: a run of an older version, which recorded none.
static uint64_t ckpt_run_id = 0;
static uint64_t state_run_id(const int *h) { return (uint32_t)h[SH_RUN_LO] | (uint64_t)(uint32_t)h[SH_RUN_HI] << 32; }

// Why an open with O_NOFOLLOW failed (errno)
static const char *open_error(void) { return errno == ELOOP ? "it is a symbolic link" : strerror(errno); }

// Creates path for writing, never through a link planted there: whatever has that name (a killed run's
// temporary file, a symbolic link) is removed first, then the file is created exclusively, refusing links.
// Returns the descriptor, or -1 (errno set).
static int create_file(const char *path) {
    if (unlink(path) != 0 && errno != ENOENT) { return -1; }
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
}

// Writes n bytes in pieces (each one counts as progress: io_progress); 0, or -1 (errno set).
static int write_all(int fd, const void *data, size_t n) {
    const char *p = (const char *)data;
    while (n > 0) {
        ssize_t w = write(fd, p, n < (16u << 20) ? n : (16u << 20));
        if (w < 0 && errno == EINTR) { continue; }
        if (w <= 0) { if (w == 0) { errno = ENOSPC; } return -1; }
        p += w; n -= (size_t)w;
        io_progress++;
    }
    return 0;
}

// Writes a file under a temporary name: header (1024 bytes; slot 255 set to the CRC of the header and the
// body parts), body parts, fsync, rename: never a torn file, and no temporary file left on a failure.
// Returns 0, or 1 with the reason in err (no fail(): the writer thread runs this).
static int write_file_atomic(const char *path, int *header, const void **parts, const size_t *bytes, int nparts,
                             char *err, size_t errlen) {
    header[CRC_SCOPE_SLOT] = CRC_SCOPE_HEADER_AND_BODY;
    uint32_t crc = crc_begin(header);
    for (int i = 0; i < nparts; i++) { crc = crc32_update(crc, parts[i], bytes[i]); }
    header[SH_CRC] = (int)crc_end(crc);
    char tmp[PATH_LEN + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = create_file(tmp);
    if (fd < 0) { snprintf(err, errlen, "cannot create '%s': %s", tmp, strerror(errno)); return 1; }
    int ok = write_all(fd, header, 256 * sizeof(int)) == 0;
    for (int i = 0; i < nparts && ok; i++) { ok = write_all(fd, parts[i], bytes[i]) == 0; }
    ok = ok && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) { snprintf(err, errlen, "cannot write '%s': %s", tmp, strerror(e)); unlink(tmp); return 1; }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        unlink(tmp);
        return 1;
    }
    return 0;
}

// fsyncs a directory, so that the renames and creations in it last through a crash.
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { if (fsync(fd) != 0) { /* best effort: the files themselves are fsync'd */ } close(fd); }
}

// ----------------------------------------------------------------------------
// Rank 0's long file work (a checkpoint write, the check of a checkpoint before a resume) runs on a
// thread of rank 0, while every rank waits here with it: rank 0 broadcasts twice a second whether the
// work is done, so a slow read or write that progresses (io_progress moves) keeps every watchdog quiet;
// a stalled rank 0 (no broadcast) trips the others' watchdog; work that makes no progress for --timeout
// (a hung disk) stops every rank, named, rank 0 printing the diagnosis first (while the others still wait in
// the broadcast: its ring says which work made no progress, flight_io).

// finished: rank 0's worker sets it (NULL: no work in flight; the other ranks pass NULL).
static void rank0_wait_done(const volatile int *finished, const char *what) {
    int rank = comm_world()->rank;
    long seen = -1;
    double since = monotonic_seconds(), beat = watch_timeout > 0 && watch_timeout < 2.0 ? watch_timeout / 4 : 0.5;
    for (;;) {
        int state = 0;   // 0 working, 1 done, 2 stuck
        if (rank == 0) {
            double t0 = monotonic_seconds();
            while (finished && !*finished && monotonic_seconds() - t0 < beat) { usleep(5000); }
            if (finished == NULL || *finished) { state = 1; }
            else if (io_progress != seen) { seen = io_progress; since = monotonic_seconds(); }
            else if (watch_timeout > 0 && monotonic_seconds() - since > watch_timeout) { state = 2; }
            flight_io(state == 1 ? "" : what, monotonic_seconds() - since);
        }
        if (state == 2) {
            char msg[256];
            snprintf(msg, sizeof(msg), "%s: no progress for %.0f s (a hung disk?; --timeout %.0f)", what,
                     monotonic_seconds() - since, watch_timeout);
            fprintf(stderr, "error: %s\n", msg);
            fflush(stderr);
            flight_end(FL_FAILED, msg);
            flight_report();
        }
        comm_host_bcast(comm_world(), &state, 1, DT_INT, 0, what);
        if (state == 2) { flight_end(FL_FAILED, "rank 0's file work made no progress"); stop_all(1); }
        if (state == 1) { break; }
    }
}

// ----------------------------------------------------------------------------
// What rank 0 knows of the checkpoints in -o: the complete ones (DONE markers), whether each can be resumed,
// and whose run each is.

static int int_order(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// The steps of the complete checkpoints in dir (DONE markers), ascending; returns how many (at most max).
static int checkpoint_steps(const char *dir, int *steps, int max) {
    int n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) { return 0; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        int s;
        char extra;
        if (sscanf(e->d_name, "DONE_%d%c", &s, &extra) == 1 && s >= 0) { steps[n++] = s; }
    }
    closedir(d);
    qsort(steps, n, sizeof(int), int_order);
    return n;
}

// Whether the checkpoint of `step` in dir can be resumed: both files there, each with a CRC of its header
// and body that matches, and the state recording this model file's CRC; else why not. (A state file of
// another version passes here: checkpoint_load refuses it by name.)
static int checkpoint_intact(const char *dir, int step, char *why, size_t n) {
    char path[2][PATH_LEN];
    int h[2][256];
    path_join(path[0], dir, "model_%08d.bin", step);
    path_join(path[1], dir, "state_%08d.bin", step);
    for (int i = 1; i >= 0; i--) {
        FILE *f = fopen(path[i], "rb");
        if (f == NULL) { snprintf(why, n, "'%s' is missing", path[i]); return 0; }
        int ok = fread(h[i], sizeof(int), 256, f) == 256;
        if (ok && i == 1 && (h[1][0] != STATE_MAGIC || h[1][1] != STATE_VERSION)) { fclose(f); return 1; }
        ok = ok && h[i][SH_CRC] != 0 && h[i][CRC_SCOPE_SLOT] == CRC_SCOPE_HEADER_AND_BODY
             && file_crc(f, h[i]) == (uint32_t)h[i][SH_CRC];
        fclose(f);
        if (!ok) { snprintf(why, n, "'%s' is corrupt (no CRC-32, or not the one of its header and body)", path[i]); return 0; }
    }
    if (h[1][SH_MODEL_CRC] != h[0][SH_CRC]) { snprintf(why, n, "'%s' belongs to another model file", path[1]); return 0; }
    return 1;
}

// The 1024-byte header of DIR/state_STEP.bin in h; 0 if it cannot be read or is not a state file of this version.
static int read_state_header(const char *dir, int step, int h[256]) {
    char path[PATH_LEN];
    path_join(path, dir, "state_%08d.bin", step);
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) { return 0; }
    int ok = read(fd, h, 1024) == 1024 && h[0] == STATE_MAGIC && h[1] == STATE_VERSION;
    close(fd);
    return ok;
}

// Rank 0, for retention: of each checkpoint met, whether it is this run's (its state file's identity, read
// once) and whether it is intact (1, 0; -1 not checked yet), checked once: written by this run, resumed, or
// checked by checkpoint_check_kept. A step whose checkpoint is deleted is forgotten (step -1).
typedef struct { int step, ours, intact; } CheckpointInfo;
static CheckpointInfo *ckpt_info = NULL;
static int ckpt_ninfo = 0, ckpt_info_cap = 0;

static CheckpointInfo *checkpoint_info_slot(int step) {
    for (int i = 0; i < ckpt_ninfo; i++) { if (ckpt_info[i].step == step) { return &ckpt_info[i]; } }
    for (int i = 0; i < ckpt_ninfo; i++) {
        if (ckpt_info[i].step < 0) { ckpt_info[i].step = step; ckpt_info[i].ours = -1; return &ckpt_info[i]; }
    }
    if (ckpt_ninfo == ckpt_info_cap) {
        ckpt_info_cap = ckpt_info_cap ? 2 * ckpt_info_cap : 64;
        ckpt_info = (CheckpointInfo *)realloc(ckpt_info, ckpt_info_cap * sizeof(CheckpointInfo));
        if (ckpt_info == NULL) { fail("out of host memory (checkpoint list)"); }
    }
    ckpt_info[ckpt_ninfo].step = step;
    ckpt_info[ckpt_ninfo].ours = -1;
    return &ckpt_info[ckpt_ninfo++];
}

static void checkpoint_info_set(int step, int ours, int intact) {
    CheckpointInfo *c = checkpoint_info_slot(step);
    c->ours = ours; c->intact = intact;
}

static CheckpointInfo *checkpoint_info(const char *dir, int step) {
    CheckpointInfo *c = checkpoint_info_slot(step);
    if (c->ours < 0) {
        int h[256];
        c->ours = read_state_header(dir, step, h) && state_run_id(h) == ckpt_run_id;
        c->intact = -1;
    }
    return c;
}

// Retention (-nk N, -nm M; 0: keep): which checkpoints stay once a new one is DONE.
static int ckpt_keep_newest = 0, ckpt_keep_every = 0;

// Rank 0's writer thread, once the checkpoint of `writing` is written: checks the CRCs of the checkpoints of
// this run that retention would count and no one has checked (those before a resume), newest first, until
// N - 1 besides the new one are known intact (a read while every rank waits with rank 0: rank0_wait_done).
static void checkpoint_check_kept(const char *dir, int writing) {
    static int steps[65536];
    int n = checkpoint_steps(dir, steps, 65536), intact = 1;
    for (int i = n - 1; i >= 0 && intact < ckpt_keep_newest; i--) {
        if (steps[i] == writing) { continue; }
        CheckpointInfo *c = checkpoint_info(dir, steps[i]);
        if (!c->ours) { continue; }
        char why[2 * PATH_LEN];
        if (c->intact < 0) { c->intact = checkpoint_intact(dir, steps[i], why, sizeof(why)); }
        intact += c->intact == 1;
    }
}

// Rank 0, once the checkpoint of `marked` is DONE: deletes this run's checkpoints older than its newest
// ckpt_keep_newest intact ones (the one just marked among them, always kept) whose step is not a multiple
// of ckpt_keep_every. Another run's checkpoints are neither counted nor deleted; one not known intact is not
// counted. The DONE marker goes first, so a checkpoint half deleted is never taken for a complete one.
static void checkpoint_retain(const char *dir, int marked) {
    if (ckpt_keep_newest <= 0) { return; }
    static int steps[65536];
    int n = checkpoint_steps(dir, steps, 65536), intact = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (steps[i] == marked) { intact++; continue; }
        CheckpointInfo *c = checkpoint_info(dir, steps[i]);
        if (!c->ours) { continue; }
        if (intact < ckpt_keep_newest) { intact += c->intact == 1; continue; }
        if (ckpt_keep_every > 0 && steps[i] % ckpt_keep_every == 0) { continue; }
        static const char *names[3] = {"DONE_%08d", "state_%08d.bin", "model_%08d.bin"};
        for (int k = 0; k < 3; k++) {
            char path[PATH_LEN];
            path_join(path, dir, names[k], steps[i]);
            if (remove(path) != 0 && errno != ENOENT) { fail("cannot delete '%s' (-nk %d)", path, ckpt_keep_newest); }
        }
        c->step = -1;
    }
}

// ----------------------------------------------------------------------------
// The directory itself: made, locked, checked, cleaned; the newest resumable checkpoint; main.log

// mkdir -p
static void make_dirs(const char *dir) {
    char buf[PATH_LEN];
    snprintf(buf, sizeof(buf), "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') { *p = '\0'; mkdir(buf, 0755); *p = '/'; }
    }
    mkdir(buf, 0755);
}

// Creates the output dir (and its parents) if needed and checks that a file can be written there.
static void check_output_dir(const char *dir, int rank) {
    if (rank == 0) { make_dirs(dir); }
    comm_host_barrier(comm_world(), "barrier (output dir)");
    char path[PATH_LEN];
    path_join(path, dir, ".write_test_%d", rank);
    int fd = create_file(path), all_ok = fd >= 0;
    if (fd >= 0) { close(fd); unlink(path); }
    comm_host_all_reduce(comm_world(), &all_ok, 1, DT_INT, HOST_MIN, "all-reduce (output dir)");
    if (!all_ok) { fail_all(rank, "-o '%s' is not a writable directory", dir); }
}

// -o DIR is this run's alone: rank 0 holds an flock() on DIR/.lock for the run's lifetime (the kernel
// releases it when the process dies, so a resume after kill -9 is never refused), and a second run on
// the same DIR stops, naming the holder. A .lock that is a symbolic link is refused (never followed).
// Every rank; once a DIR is locked, locking it again does nothing.
static void lock_output_dir(const char *dir, int rank) {
    static char locked[PATH_LEN] = "";
    if (!strcmp(locked, dir)) { return; }
    snprintf(locked, sizeof(locked), "%s", dir);
    char msg[PATH_LEN + 512] = "";
    if (rank == 0) {
        char path[PATH_LEN];
        path_join(path, dir, ".lock");
        int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644);
        if (fd < 0) { snprintf(msg, sizeof(msg), "cannot open '%s': %s", path, open_error()); }
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char holder[256] = "";
            ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            snprintf(msg, sizeof(msg), "-o '%s' is in use by another run (%s); wait for it, or use another directory",
                     dir, holder[0] ? holder : "unknown");
        } else {   // ours until this process ends: the descriptor stays open
            char host[128] = "?", line[256];
            gethostname(host, sizeof(host) - 1);
            char since[64] = "?";
            time_t now = time(NULL);
            struct tm tm;
            if (gmtime_r(&now, &tm)) { strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &tm); }
            int len = snprintf(line, sizeof(line), "pid %d on %s since %s\n", (int)getpid(), host, since);
            if (ftruncate(fd, 0) != 0 || pwrite(fd, line, len, 0) != len) {
                snprintf(msg, sizeof(msg), "cannot write '%s'", path);
            }
        }
    }
    comm_host_bcast(comm_world(), msg, sizeof(msg), DT_BYTE, 0, "broadcast (lock)");
    if (msg[0]) { fail_all(rank, "%s", msg); }
}

// Whether DIR/NAME (a printf name of step) exists (a link counts: it is never followed).
static int step_file_exists(const char *dir, const char *name, int step) {
    char path[PATH_LEN];
    struct stat st;
    path_join(path, dir, name, step);
    return lstat(path, &st) == 0;
}

// Rank 0, holding the lock: removes what an interrupted run left in -o (it could keep a full disk full):
// temporary files, model and state files of a step without a DONE marker (never complete), and a DONE
// marker left without both (a move aside or a deletion cut short).
static void clean_output_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) { return; }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int step, len = (int)strlen(e->d_name), debris = len > 4 && !strcmp(e->d_name + len - 4, ".tmp");
        int ours = !strncmp(e->d_name, "model_", 6) || !strncmp(e->d_name, "state_", 6);
        char extra, path[PATH_LEN], name[64];
        if (!debris && ours && sscanf(e->d_name + 6, "%d.bin%c", &step, &extra) == 1 && step >= 0) {
            snprintf(name, sizeof(name), "%.6s%08d.bin", e->d_name, step);   // exactly a checkpoint's name
            debris = !strcmp(e->d_name, name) && !step_file_exists(dir, "DONE_%08d", step);
        }
        if (!debris && sscanf(e->d_name, "DONE_%d%c", &step, &extra) == 1 && step >= 0) {
            snprintf(name, sizeof(name), "DONE_%08d", step);
            debris = !strcmp(e->d_name, name) && !step_file_exists(dir, "model_%08d.bin", step)
                     && !step_file_exists(dir, "state_%08d.bin", step);
        }
        if (!debris) { continue; }
        path_join(path, dir, "%s", e->d_name);
        if (unlink(path) == 0) { removed++; }
    }
    closedir(d);
    if (removed) { printf("removed %d unfinished checkpoint file(s) from %s (a run stopped while writing)\n", removed, dir); }
}

// ----------------------------------------------------------------------------
// Resume and the run in -o. main.log's first line "run:ID" records the run (checkpoint.h's ckpt_run_id); -y
// continues the newest intact checkpoint of that run, and refuses one of another run; the unusable ones it
// passes over are moved into DIR/unusable/ once -o is locked, so none of them stays the "newest". A fresh
// run refuses a directory that holds checkpoints (an earlier run's), or with --overwrite deletes them.

// The run dir's main.log records: 1 and its identity (0: a log of an older version, without a run line),
// 0 when there is no main.log or not one whole line in it (a kill right after it was created), -1 when it
// cannot be read (why in err). A link is not followed.
static int log_run_id(const char *dir, uint64_t *id, char *err, size_t n) {
    char path[PATH_LEN], line[64];
    path_join(path, dir, "main.log");
    *id = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) { return 0; }
    if (fd < 0) { snprintf(err, n, "cannot open '%s': %s", path, open_error()); return -1; }
    ssize_t got = read(fd, line, sizeof(line) - 1);
    close(fd);
    line[got > 0 ? got : 0] = '\0';
    if (strchr(line, '\n') == NULL && got < (ssize_t)sizeof(line) - 1) { return 0; }
    unsigned long long v;
    char nl;
    if (sscanf(line, "run:%16llx%c", &v, &nl) == 2 && nl == '\n') { *id = v; }
    return 1;
}

// Rank 0's thread: the newest intact checkpoint of the DONE ones in dir (-1: none), the others named; it
// must be of the run main.log records (any, without a main.log), else the error says so.
typedef struct {
    const char *dir;
    int step;
    uint64_t run;                   // the identity of the run resumed
    char error[3 * PATH_LEN];
    volatile int finished;
    pthread_t thread;
} CheckpointSearch;

static void *checkpoint_search(void *arg) {
    CheckpointSearch *c = (CheckpointSearch *)arg;
    static int steps[65536];
    int n = checkpoint_steps(c->dir, steps, 65536), h[256];
    uint64_t logged;
    int has_log = log_run_id(c->dir, &logged, c->error, sizeof(c->error));
    c->step = -1;
    if (has_log == 1 && logged == 0 && n > 0) {   // (a log without its run:ID line: the run it records is unknown)
        printf("note: '%s/main.log' has no run:ID line (cut, or written by an older version): the checkpoints' own "
               "identity decides which run continues\n", c->dir);
        has_log = 0;
    }
    for (int i = n - 1; i >= 0 && c->step < 0 && has_log >= 0; i--) {
        char why[2 * PATH_LEN];
        if (checkpoint_intact(c->dir, steps[i], why, sizeof(why))) {
            // (a state file of another version: checkpoint_load refuses it by name)
            uint64_t run = read_state_header(c->dir, steps[i], h) ? state_run_id(h) : logged;
            if (has_log && run != logged) {
                snprintf(c->error, sizeof(c->error), "-y: the checkpoint of step %d in '%s' is of run %016llx, "
                         "not of run %016llx that its main.log records: a resume continues only that run (move "
                         "the other run's files out of '%s', or start a new run there with -y 0 --overwrite)",
                         steps[i], c->dir, (unsigned long long)run, (unsigned long long)logged, c->dir);
                break;
            }
            c->step = steps[i];
            c->run = has_log ? logged : run;
            checkpoint_info_set(steps[i], 1, 1);
            continue;
        }
        printf("note: the checkpoint of step %d cannot be resumed: %s; %s\n", steps[i], why,
               i > 0 ? "trying the one before" : "there is none before");
    }
    c->finished = 1;
    return NULL;
}

static int ckpt_searched = 0;   // latest_checkpoint ran: the checkpoints after the step it found are unusable

// The step of the newest intact complete checkpoint of main.log's run in dir, or -1 (same answer on every
// rank; an existing dir is locked first): rank 0 checks the files (CRCs: a long read, waited for with
// rank0_wait_done) and broadcasts its choice, and the run's identity (ckpt_run_id) when it found one.
static int latest_checkpoint(const char *dir) {
    static CheckpointSearch c;
    int rank = comm_world()->rank, rank0 = rank == 0, exists = 0;
    struct stat st;
    if (rank0) { exists = stat(dir, &st) == 0 && S_ISDIR(st.st_mode); }
    comm_host_bcast(comm_world(), &exists, 1, DT_INT, 0, "broadcast (checkpoint dir)");
    if (exists) { lock_output_dir(dir, rank); }   // (what it finds stays so while this run holds -o)
    c.dir = dir; c.step = -1; c.run = 0; c.error[0] = '\0'; c.finished = 0;
    if (rank0 && pthread_create(&c.thread, NULL, checkpoint_search, &c) != 0) {
        fail("cannot start a thread to check the checkpoints in '%s'", dir);
    }
    rank0_wait_done(rank0 ? &c.finished : NULL, "the check of the checkpoints before a resume");
    if (rank0) { pthread_join(c.thread, NULL); }
    comm_host_bcast(comm_world(), c.error, sizeof(c.error), DT_BYTE, 0, "broadcast (checkpoint)");
    if (c.error[0]) { fail_all(rank, "%s", c.error); }
    int best = c.step;
    uint64_t run = c.run;
    comm_host_bcast(comm_world(), &best, 1, DT_INT, 0, "broadcast (checkpoint)");
    comm_host_bcast(comm_world(), &run, 8, DT_BYTE, 0, "broadcast (checkpoint)");
    if (best >= 0) { ckpt_run_id = run; }
    ckpt_searched = 1;
    return best;
}

// Moves DIR/NAME (a printf name of step) into DIR/unusable/; 0, or 1 with the reason in err.
static int move_aside(const char *dir, const char *name, int step, char *err, size_t n) {
    char from[PATH_LEN], to[PATH_LEN], sub[PATH_LEN];
    path_join(from, dir, name, step);
    path_join(sub, dir, "unusable");
    path_join(to, sub, name, step);
    if (rename(from, to) == 0 || errno == ENOENT) { return 0; }
    snprintf(err, n, "cannot move '%s' to '%s': %s", from, to, strerror(errno));
    return 1;
}

// Rank 0, -o locked, after latest_checkpoint: moves the checkpoints newer than resume_step (all of them when
// it is -1: -y 2 found none to resume; then main.log too, which a fresh run replaces) into DIR/unusable/, the
// model and state files first, the DONE marker last. Returns 1 with the reason in err if it cannot.
static int checkpoint_move_unusable(const char *dir, int resume_step, char *err, size_t n) {
    static int steps[65536];
    int count = checkpoint_steps(dir, steps, 65536), moved = 0;
    char sub[PATH_LEN], list[256] = "";
    struct stat st;
    path_join(sub, dir, "unusable");
    for (int i = 0; i < count; i++) {
        if (steps[i] <= resume_step) { continue; }
        if (moved == 0 && mkdir(sub, 0755) != 0 && (errno != EEXIST || lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode))) {
            snprintf(err, n, "cannot make the directory '%s' for the unusable checkpoints: %s", sub,
                     errno == EEXIST ? "something else has that name" : strerror(errno));
            return 1;
        }
        if (move_aside(dir, "model_%08d.bin", steps[i], err, n) || move_aside(dir, "state_%08d.bin", steps[i], err, n)
            || move_aside(dir, "DONE_%08d", steps[i], err, n)) { return 1; }
        size_t len = strlen(list);
        snprintf(list + len, sizeof(list) - len, "%s%d", moved ? ", " : "", steps[i]);
        moved++;
    }
    if (moved && resume_step < 0 && move_aside(dir, "main.log", 0, err, n)) { return 1; }
    if (moved) {
        printf("moved the checkpoint(s) of step %s, which cannot be resumed, to %s (this run %s)\n", list, sub,
               resume_step < 0 ? "starts afresh" : "continues an earlier step");
        sync_dir(dir);
    }
    return 0;
}

// Deletes the complete checkpoints in dir (DONE first) and what DIR/unusable/ holds; returns how many it
// deleted, or -1 with the reason in err.
static int checkpoint_delete_all(const char *dir, char *err, size_t n) {
    static int steps[65536];
    int count = checkpoint_steps(dir, steps, 65536);
    static const char *names[3] = {"DONE_%08d", "state_%08d.bin", "model_%08d.bin"};
    char path[PATH_LEN];
    for (int i = 0; i < count; i++) {
        for (int k = 0; k < 3; k++) {
            path_join(path, dir, names[k], steps[i]);
            if (remove(path) != 0 && errno != ENOENT) { snprintf(err, n, "cannot delete '%s': %s", path, strerror(errno)); return -1; }
        }
    }
    char sub[PATH_LEN];
    path_join(sub, dir, "unusable");
    DIR *d = opendir(sub);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { path_join(path, sub, "%s", e->d_name); unlink(path); }
    }
    if (d) { closedir(d); rmdir(sub); }
    return count;
}

// Rank 0, -o locked, a fresh run: a directory holding complete checkpoints (an earlier run's) is refused,
// naming them and the flags that continue (-y 1) or delete them (--overwrite). Returns 1 with the reason in err.
static int run_dir_fresh(const char *dir, int overwrite, char *err, size_t n) {
    static int steps[65536];
    int count = checkpoint_steps(dir, steps, 65536);
    if (count == 0) { return 0; }
    if (overwrite) {
        int deleted = checkpoint_delete_all(dir, err, n);
        if (deleted < 0) { return 1; }
        printf("--overwrite: deleted the %d checkpoint(s) of an earlier run in %s\n", deleted, dir);
        sync_dir(dir);
        return 0;
    }
    char list[256] = "";
    for (int i = 0; i < count && i < 8; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof(list) - len, "%s%d", i ? ", " : "", steps[i]);
    }
    if (count > 8) { size_t len = strlen(list); snprintf(list + len, sizeof(list) - len, " and %d more", count - 8); }
    snprintf(err, n, "-o '%s' holds the checkpoints of an earlier run (steps %s): -y 1 continues that run, "
             "--overwrite deletes them and starts this one, or give another -o", dir, list);
    return 1;
}

// Every rank, -o locked: prepares the run directory. Rank 0 removes what an interrupted run left, moves
// the checkpoints a resume passed over into DIR/unusable/, and a fresh run (resume_step < 0) refuses an
// earlier run's checkpoints or (overwrite) deletes them; the fresh run's identity is fresh_id. Then the run owns
// the directory, and the flight recorder's rings move into DIR/flight/ (flight_move).
static void run_dir_prepare(const char *dir, int rank, int resume_step, int overwrite, uint64_t fresh_id) {
    char msg[3 * PATH_LEN] = "";
    if (rank == 0) {
        clean_output_dir(dir);
        if (!(ckpt_searched && checkpoint_move_unusable(dir, resume_step, msg, sizeof(msg))) && resume_step < 0) {
            run_dir_fresh(dir, overwrite, msg, sizeof(msg));
        }
    }
    comm_host_bcast(comm_world(), msg, sizeof(msg), DT_BYTE, 0, "broadcast (output dir)");
    if (msg[0]) { fail_all(rank, "%s", msg); }
    if (resume_step < 0) { ckpt_run_id = fresh_id; }
    flight_move(dir);
}

// ----------------------------------------------------------------------------
// main.log, rank 0: one descriptor, every line one write; the first line, "run:ID", names the run (none for
// a run of an older version). A resumed run first drops the lines of the steps at
// and after the resumed one (a run killed after the checkpoint logged them) and a last line without its
// newline (cut by a kill), so the log equals an uninterrupted run's; a write that fails (a full disk) is
// cut back to the last whole line and stops the run: never a torn log. Links are never followed.

static void log_keep_lines(const char *path, int resume_step) {
    char tmp[PATH_LEN + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int in = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (in < 0) { if (errno == ENOENT) { return; } fail("cannot open '%s': %s", path, open_error()); }
    if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) {   // (before the temporary file: none is left behind)
        fail("'%s' is not a regular file: move it out of the way to resume", path);
    }
    FILE *r = fdopen(in, "r");
    int out = create_file(tmp);
    if (r == NULL || out < 0) { fail("cannot create '%s': %s", tmp, strerror(errno)); }
    char line[8192];
    while (fgets(line, sizeof(line), r)) {
        int s, n = (int)strlen(line);
        if (n == 0 || line[n - 1] != '\n') { continue; }                    // cut short
        if (sscanf(line, "s:%d ", &s) == 1 && s >= resume_step) { continue; }   // redone by this run
        if (write_all(out, line, n) != 0) { fail("cannot write '%s' (disk full?)", tmp); }
    }
    fclose(r);
    if (fsync(out) != 0 || close(out) != 0) { unlink(tmp); fail("cannot write '%s' (disk full?)", tmp); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); fail("cannot rename '%s' to '%s': %s", tmp, path, strerror(e)); }
}

static void log_printf(int fd, const char *fmt, ...) {
    if (fd < 0) { return; }
    char line[4096];   // (a MoE layer's load line: E <= 256 counts)
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    off_t before = lseek(fd, 0, SEEK_END);
    if (n < 0 || n >= (int)sizeof(line) || write_all(fd, line, (size_t)n) != 0) {
        int e = errno;
        if (before >= 0 && ftruncate(fd, before) != 0) { /* the error below stops the run either way */ }
        fail("cannot write to main.log (disk full? %s): the run stops rather than leave a torn log", strerror(e));
    }
}

static int open_log(const char *dir, int resume_step) {
    char path[PATH_LEN];
    path_join(path, dir, "main.log");
    if (resume_step > 0) { log_keep_lines(path, resume_step); }
    int fd = resume_step > 0 ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0644) : create_file(path);
    if (fd < 0) { fail("cannot open '%s': %s", path, open_error()); }
    if (ckpt_run_id != 0 && lseek(fd, 0, SEEK_END) == 0) { log_printf(fd, "run:%016llx\n", (unsigned long long)ckpt_run_id); }
    return fd;
}

static void log_close(int fd) {
    if (fd >= 0 && (fsync(fd) != 0 || close(fd) != 0)) { fail("cannot close main.log (%s)", strerror(errno)); }
}

#endif
