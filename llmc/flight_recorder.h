// The flight recorder: each rank's last communication calls, in a ring that outlives the rank.
//   what    every collective and exchange made through comm.h (device and host), and MPI_Init and MPI_Finalize: the
//           group (its kind and instance), the call's number (a collective's in its group, a message's in its group,
//           peer and direction), the operation, the peer, the element count and type, what it belongs to (step,
//           micro-batch, layer, phase: the model's code says, flight_at and flight_layer), when it was posted and
//           when it was seen complete (CUDA: an event recorded after the call, queried later, never waited on)
//   where   a file mapped into memory, one per rank, from the start (before MPI_Init): first in the job's temporary
//           folder ($TMPDIR/llmc-flight-JOB), then, once the run owns its run directory (-o), in DIR/flight/ (the
//           temporary file removed). Without -o it stays in the temporary folder and goes at a normal end. The
//           kernel holds a mapping's pages, so a rank stopped (SIGSTOP) or killed (kill -9) leaves its ring whole.
//   the end how the rank ended (the watchdog's timeout, an error, an MPI error, MPI_Finalize), the last signal it
//           received (mpirun ends a job with SIGTERM), and a heartbeat the watchdog's thread writes (a stopped
//           rank's stops); rank 0's long file work (a checkpoint write) and its last progress
//   readers flight_diagnosis.h: the watchdog's diagnosis, the MPI error handler's, and dev/flight.sh's
// Recording never changes what the program computes and never stops a run: a ring whose file cannot be made
// stays in memory (its rank then diagnoses only itself). It costs two clock reads and a 64-byte store per call.
#ifndef LLMC_FLIGHT_RECORDER_H
#define LLMC_FLIGHT_RECORDER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#ifdef USE_CUDA
#include <cuda_runtime.h>
#endif

#define FLIGHT_MAGIC "LLMCFLT1"
#define FLIGHT_VERSION 2           // (2: the diagnosis line in the header)
#define FLIGHT_RECORDS 256          // train_gpt's ring: a few steps of a small run, the last of a large one
#define FLIGHT_GROUPS 32            // groups one rank records (its grid's, the host groups of the checkpoints)
#define FLIGHT_HEADER_BYTES 4096    // the header's room in the file; the records follow
#define FLIGHT_MAX_WORLD 65536      // the most ranks a ring may name (a reader sizes its tables by the world)
#define FLIGHT_PATH 4352            // a ring file's path at most (a folder name of at most 4096 bytes, and the file's)

// The operations (their names: flight_op_names)
typedef enum {
    FL_NONE, FL_ALL_REDUCE, FL_REDUCE_SCATTER, FL_ALL_GATHER, FL_ALL_TO_ALL, FL_BROADCAST, FL_REDUCE, FL_GATHER,
    FL_BARRIER, FL_SPLIT, FL_SEND, FL_RECV, FL_INIT, FL_FINALIZE, FL_NOPS
} FlightOp;
static const char *const flight_op_names[FL_NOPS] = {"?", "all-reduce", "reduce-scatter", "all-gather", "all-to-all",
    "broadcast", "reduce", "gather", "barrier", "split", "send", "recv", "MPI_Init", "MPI_Finalize"};
static int flight_is_message(int op) { return op == FL_SEND || op == FL_RECV; }

// What a call belongs to: the phase of the step (their names: flight_phase_names), the micro-batch, the layer
typedef enum {
    PH_SETUP, PH_FORWARD, PH_BACKWARD, PH_WEIGHTS, PH_OPTIMIZER, PH_CHECKPOINT, PH_EVAL, PH_END, PH_N
} FlightPhase;
static const char *const flight_phase_names[PH_N] = {"set-up", "forward", "backward", "W", "optimizer", "checkpoint",
                                                     "evaluation", "end"};
#define FL_LAYER_NONE (-1)
#define FL_LAYER_EMBEDDING (-2)     // the token and position embeddings
#define FL_LAYER_HEAD (-3)          // the final norm, the LM head and the loss
typedef struct {
    int32_t step;                   // the training step (-1: before the first)
    int16_t micro, layer;           // the micro-batch (-1: none); the layer, or FL_LAYER_*
    int32_t phase;                  // FlightPhase
} FlightContext;

// One call. A message's number counts the messages of its group to (send) or from (recv) that peer.
typedef struct {
    uint64_t index;                 // its number in the rank's history, from 0 (a reader checks the slot holds it)
    double posted, done;            // wall-clock seconds (CLOCK_REALTIME) posted, and seen complete (0: not yet)
    int64_t count;                  // elements (a message's; an all-to-all: what this rank sends)
    uint32_t seq;                   // the call's number, from 1 (a collective: in its group; a message: see above)
    int32_t peer;                   // a message's peer (world rank); -1
    int32_t tag;                    // what a message is (the pipeline's: micro-batch, activation or gradient); 0
    uint8_t group, op, type, elem;  // the header's group (1..), FlightOp, comm.h's DType, bytes per element
    FlightContext ctx;
    int32_t flags;                  // FL_ASYNC: not waited for yet (a later wait completes it); FL_DEVICE: an event
                                    // completes it (CUDA, flight_poll)
} FlightRecord;
#define FL_ASYNC 1
#define FL_DEVICE 2

// A group this rank belongs to: groups are known across ranks by (name, instance).
typedef struct {
    char name[12];                  // its kind: tp, dp, pp, world, ...
    int32_t instance;               // the lowest world rank among its members
    int32_t size, rank;             // its size, this rank's place in it
    uint32_t posted, done;          // the number of the last collective posted, and of the last seen complete
} FlightGroup;

// How a rank's recording ended
typedef enum { FL_RUNNING, FL_TIMED_OUT, FL_FAILED, FL_MPI_ERROR, FL_FINISHED } FlightEnd;
static const char *const flight_end_names[] = {"running", "timed out", "failed", "MPI error", "finished"};

typedef struct {
    char magic[8];                  // FLIGHT_MAGIC
    int32_t version, header_bytes, record_bytes, capacity;   // capacity: the ring's records
    int32_t rank, world, pid, ngroups;
    char host[64], job[64];         // the host's name; the job's (the launcher's PMIX_NAMESPACE): one job's rings
    double started, heartbeat;      // wall seconds: the start; the watchdog's last beat (0: no watchdog)
    double timeout;                 // --timeout
    uint64_t written;               // records written: the ring holds [written - capacity, written)
    FlightContext now;              // what the rank is doing
    int32_t end, signal;            // FlightEnd; the last signal received (0: none)
    double ended, signalled;        // when
    char why[256];                  // the end's words (the watchdog's line, the error)
    char io_what[96];               // rank 0's file work in flight (a checkpoint write), "" none
    double io_since;                // its last progress
    FlightGroup groups[FLIGHT_GROUPS];
    char diagnosis[2048];           // the diagnosis line this rank printed as the job ran ("" none): dev/flight.sh
                                    // prints it first, as the ranks the launcher ended afterwards no longer show it
} FlightHeader;
static_assert(sizeof(FlightHeader) <= FLIGHT_HEADER_BYTES, "the header must fit its room in the file");
static_assert(sizeof(FlightRecord) == 64, "a record is 64 bytes");

// This process's recorder: the ring (header, then records) and what only the recording rank needs.
typedef struct {
    char *volatile base;            // the mapping (or memory); NULL: not started (the idle header holds the groups)
    int fd;                         // the ring file's (-1: in memory)
    char path[FLIGHT_PATH];         // the ring file ("" in memory)
    char job_dir[FLIGHT_PATH];      // the job's temporary folder
    char run_dir[FLIGHT_PATH];      // DIR/flight once moved there, else ""
    int *world_of[FLIGHT_GROUPS];   // each group's members' world ranks (NULL: the world, rank = world rank)
    uint32_t *sent[FLIGHT_GROUPS], *received[FLIGHT_GROUPS];   // messages posted to / from each member
    int counted[FLIGHT_GROUPS];     // the members those two count
    uint64_t unresolved;            // CUDA: the oldest record whose event may still be pending
    int world;                      // the world's group number (MPI_Init, MPI_Finalize), 0 before flight_start
} Flight;
static Flight flight = {NULL, -1, "", "", "", {}, {}, {}, {}, 0, 0};
static FlightHeader flight_idle;    // the header before the ring exists (and test_gpt's, without --check-comm)
// The recording thread's last sign of progress (wall seconds): a call posted, a step, phase or layer begun. The
// watchdog's other test (guard.h: flight_device_stall) reads it.
static volatile double flight_host_seen = 0.0;

static double flight_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static FlightHeader *flight_header(void) { char *b = flight.base; return b ? (FlightHeader *)b : &flight_idle; }
static FlightRecord *flight_slot(uint64_t index) {
    FlightHeader *h = flight_header();
    return (FlightRecord *)((char *)h + FLIGHT_HEADER_BYTES) + index % (uint64_t)h->capacity;
}
static size_t flight_bytes(int capacity) { return FLIGHT_HEADER_BYTES + (size_t)capacity * sizeof(FlightRecord); }

// ----------------------------------------------------------------------------
// the ring's file

// The launcher's name for this job (the same on every rank), made safe for a file name; "pid<N>" without one.
static void flight_job_name(char *out, size_t n) {
    const char *e = getenv("PMIX_NAMESPACE");
    if (e == NULL || !*e) { e = getenv("OMPI_MCA_ess_base_jobid"); }
    if (e == NULL || !*e) { e = getenv("SLURM_JOB_ID"); }
    if (e == NULL || !*e) { snprintf(out, n, "pid%d", (int)getpid()); return; }
    size_t i = 0;
    for (; e[i] && i + 1 < n && i < 48; i++) { out[i] = isalnum((unsigned char)e[i]) || e[i] == '-' ? e[i] : '_'; }
    out[i] = '\0';
}

// A ring's file name in dir (1 if it fits out's n bytes).
static int flight_ring_name(char *out, size_t n, const char *dir, int rank) {
    return snprintf(out, n, "%s/rank_%05d.ring", dir, rank) < (int)n;
}

// Maps a ring file of `bytes` at path (made, or reused; never through a link; its blocks reserved, so that a full
// disk cannot fault a write into the mapping). Its descriptor holds an flock for the rank's life: a ring another
// live process holds is left alone. NULL if any of it fails (a file it made or held is removed).
static char *flight_map_file(const char *path, size_t bytes, int *fd_out) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) { return NULL; }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return NULL;
    }
    void *p = ftruncate(fd, 0) == 0 && posix_fallocate(fd, 0, (off_t)bytes) == 0
            ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) { unlink(path); close(fd); return NULL; }   // (a full disk, a file size limit)
    *fd_out = fd;
    return (char *)p;
}

// A folder of this user's, made if needed (a link or another's folder is refused): 1 if usable.
static int flight_own_dir(const char *dir, int mode) {
    mkdir(dir, mode);
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid();
}

// Whether the ring file at path belongs to a process of this host that is gone (its folder: a dead job's).
static int flight_ring_is_dead(const char *path, const char *host) {
    FlightHeader h;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) { return 0; }
    int ok = read(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) && !memcmp(h.magic, FLIGHT_MAGIC, 8);
    close(fd);
    return ok && !strncmp(h.host, host, sizeof(h.host)) && kill(h.pid, 0) != 0 && errno == ESRCH;
}

// The temporary folders of earlier jobs on this host whose ranks are all gone (killed before they moved their rings
// into a run directory, or jobs without -o that failed): removed, so that they do not pile up. (Run by one rank of a
// node: the launcher's local rank 0.) Their diagnosis was printed when they ended.
static void flight_sweep(const char *tmp, const char *mine, const char *host) {
    DIR *d = opendir(tmp);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char dir[FLIGHT_PATH], path[FLIGHT_PATH];
        if (strncmp(e->d_name, "llmc-flight-", 12) != 0) { continue; }
        if (snprintf(dir, sizeof(dir), "%s/%s", tmp, e->d_name) >= (int)sizeof(dir) || !strcmp(dir, mine)) { continue; }
        DIR *sub = opendir(dir);
        struct dirent *f;
        int dead = sub != NULL, rings = 0;   // (a folder without a ring: a job starting, or left empty)
        while (sub && (f = readdir(sub)) != NULL && dead) {
            if (f->d_name[0] == '.') { continue; }
            int fits = snprintf(path, sizeof(path), "%s/%s", dir, f->d_name) < (int)sizeof(path);
            dead = fits && flight_ring_is_dead(path, host);
            rings++;
        }
        if (sub) { closedir(sub); }
        struct stat st;
        if (rings == 0 && stat(dir, &st) == 0 && time(NULL) - st.st_mtime > 60) { rmdir(dir); }   // (left empty)
        if (!dead || rings == 0) { continue; }
        sub = opendir(dir);
        while (sub && (f = readdir(sub)) != NULL) {
            int fits = snprintf(path, sizeof(path), "%s/%s", dir, f->d_name) < (int)sizeof(path);
            if (f->d_name[0] != '.' && fits) { unlink(path); }
        }
        if (sub) { closedir(sub); }
        rmdir(dir);
    }
    if (d) { closedir(d); }
}

static int flight_group(const char *name, int size, int rank, const int *world_of);

// Starts the ring (before MPI_Init: the rank and the world are the launcher's, -1 and 0 if it gives none) in the
// job's temporary folder, or in memory. The header keeps the groups registered before.
static void flight_start(int rank, int world, double timeout) {
    FlightHeader h = flight_idle;
    memcpy(h.magic, FLIGHT_MAGIC, 8);
    h.version = FLIGHT_VERSION;
    h.header_bytes = FLIGHT_HEADER_BYTES;
    h.record_bytes = (int32_t)sizeof(FlightRecord);
    h.capacity = FLIGHT_RECORDS;
    h.rank = rank < 0 ? 0 : rank;
    h.world = world > h.rank ? world : h.rank + 1;   // (no launcher: one rank)
    h.pid = (int32_t)getpid();
    gethostname(h.host, sizeof(h.host) - 1);
    flight_job_name(h.job, sizeof(h.job));
    h.started = flight_clock();
    h.timeout = timeout;
    h.now = (FlightContext){-1, -1, FL_LAYER_NONE, PH_SETUP};
    const char *tmp = getenv("TMPDIR"), *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");   // (the node's first rank sweeps)
    if (local == NULL) { local = getenv("SLURM_LOCALID"); }      // srun
    if (local == NULL) { local = getenv("MPI_LOCALRANKID"); }    // MPICH's Hydra
    if (tmp == NULL || !*tmp) { tmp = "/tmp"; }
    int fits = snprintf(flight.job_dir, sizeof(flight.job_dir), "%s/llmc-flight-%s", tmp, h.job) < 4096;
    if (fits && (local == NULL || atoi(local) == 0)) { flight_sweep(tmp, flight.job_dir, h.host); }
    char *base = NULL;
    if (fits && flight_own_dir(flight.job_dir, 0700) &&
        flight_ring_name(flight.path, sizeof(flight.path), flight.job_dir, h.rank)) {
        base = flight_map_file(flight.path, flight_bytes(h.capacity), &flight.fd);
    }
    if (base == NULL) {   // (in memory: this rank's diagnosis covers itself only)
        base = (char *)calloc(1, flight_bytes(h.capacity));
        if (fits) { rmdir(flight.job_dir); }   // (once empty)
        flight.path[0] = '\0';
        if (base == NULL) { return; }
    }
    memcpy(base, &h, sizeof(h));
    flight.base = base;
    flight.world = flight_group("world", h.world, h.rank, NULL);   // (every rank's: MPI_Init is its first call)
}

// A ring in memory of `capacity` records (test_gpt --check-comm: one that holds a whole step), from now on.
static void flight_start_memory(int capacity) {
    FlightHeader h = *flight_header();
    h.capacity = capacity;
    h.written = 0;
    char *base = (char *)calloc(1, flight_bytes(capacity));
    if (base == NULL) { return; }
    memcpy(base, &h, sizeof(h));
    flight.base = base;   // (a ring before stays mapped: the watchdog's thread may be reading it)
}

// The run directory (-o) is this run's now (run_dir.h: after its lock and its checks): the ring moves into
// DIR/flight/, where it outlives the job, and the temporary file goes. (If it cannot, it stays where it is.)
static void flight_move(const char *run_dir) {
    FlightHeader *h = flight_header();
    if (flight.base == NULL || flight.run_dir[0]) { return; }
    char dir[FLIGHT_PATH], path[FLIGHT_PATH];
    if (snprintf(dir, sizeof(dir), "%s/flight", run_dir) >= 4096 || !flight_own_dir(dir, 0755) ||
        !flight_ring_name(path, sizeof(path), dir, h->rank)) {
        return;
    }
    int fd;
    size_t bytes = flight_bytes(h->capacity);
    char *p = flight_map_file(path, bytes, &fd);
    if (p == NULL) { rmdir(dir); return; }   // (rmdir: if it is empty)
    memcpy(p, flight.base, bytes);
    flight.base = p;   // (the old mapping stays: the watchdog's thread may be reading it)
    if (flight.path[0]) { unlink(flight.path); rmdir(flight.job_dir); }   // (rmdir: once the folder is empty)
    if (flight.fd >= 0) { close(flight.fd); }
    flight.fd = fd;
    memcpy(flight.path, path, sizeof(path));
    memcpy(flight.run_dir, dir, sizeof(dir));
}

// ----------------------------------------------------------------------------
// the groups and the calls

// Registers a group: its kind's name, size, this rank's place, and its members' world ranks (NULL: the world).
// Returns its number for flight_post (0: the table is full, its calls are not recorded). A group registered again
// (a host group made anew for each checkpoint, the world's two communicators) keeps its number and its counts.
static int flight_group(const char *name, int size, int rank, const int *world_of) {
    FlightHeader *h = flight_header();
    int instance = world_of ? world_of[0] : 0;
    for (int i = 1; world_of && i < size; i++) { if (world_of[i] < instance) { instance = world_of[i]; } }
    int i = 0;
    while (i < h->ngroups && !(h->groups[i].instance == instance && !strncmp(h->groups[i].name, name, 11))) { i++; }
    if (i == FLIGHT_GROUPS) { return 0; }
    if (i == h->ngroups) {
        FlightGroup g = {};
        snprintf(g.name, sizeof(g.name), "%s", name);
        g.instance = instance;
        h->groups[i] = g;
        h->ngroups = i + 1;
    }
    h->groups[i].size = size;
    h->groups[i].rank = rank;
    if (flight.sent[i] == NULL) {   // (the counts of messages to and from each member: once)
        flight.sent[i] = (uint32_t *)calloc(size > 0 ? size : 1, sizeof(uint32_t));
        flight.received[i] = (uint32_t *)calloc(size > 0 ? size : 1, sizeof(uint32_t));
        flight.counted[i] = flight.sent[i] && flight.received[i] ? size : 0;
    }
    if (world_of && flight.world_of[i] == NULL && (flight.world_of[i] = (int *)malloc(size * sizeof(int))) != NULL) {
        memcpy(flight.world_of[i], world_of, size * sizeof(int));
    }
    return i + 1;
}

// The number the next collective of a group will have (--check-collectives compares it before the call).
static uint32_t flight_next_seq(int group) { return group > 0 ? flight_header()->groups[group - 1].posted + 1 : 0; }

// Records a call as it is posted: a collective (peer -1) or a message to / from group rank peer. Returns its id
// for flight_done (0: not recorded). The call's number is counted whether or not a ring records it.
static uint64_t flight_post(int group, int op, int peer, size_t count, int type, int elem, int tag) {
    FlightHeader *h = flight_header();
    if (group <= 0 || group > h->ngroups) { return 0; }
    FlightGroup *g = &h->groups[group - 1];
    int message = flight_is_message(op) && peer >= 0 && peer < flight.counted[group - 1];
    uint32_t seq = !message ? ++g->posted
                 : op == FL_SEND ? ++flight.sent[group - 1][peer] : ++flight.received[group - 1][peer];
    if (h->capacity == 0) { return 0; }
    uint64_t i = h->written;
    FlightRecord *r = flight_slot(i);
    r->index = UINT64_MAX;   // (being written: a reader skips it)
    __atomic_thread_fence(__ATOMIC_RELEASE);
    r->posted = flight_host_seen = flight_clock();
    r->done = 0.0;
    r->count = (int64_t)count;
    r->seq = seq;
    r->peer = !message ? -1 : flight.world_of[group - 1] ? flight.world_of[group - 1][peer] : peer;
    r->tag = tag;
    r->group = (uint8_t)group;
    r->op = (uint8_t)op;
    r->type = (uint8_t)type;
    r->elem = (uint8_t)elem;
    r->ctx = h->now;
    r->flags = 0;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    r->index = i;
    h->written = i + 1;
    return i + 1;
}

// The call of id is complete (seen now). Ids the ring no longer holds are ignored.
static void flight_done(uint64_t id) {
    if (id == 0) { return; }
    FlightRecord *r = flight_slot(id - 1);
    if (r->index != id - 1 || r->done != 0.0) { return; }
    r->done = flight_clock();
    FlightGroup *g = &flight_header()->groups[r->group - 1];
    if (!flight_is_message(r->op) && r->seq > g->done) { g->done = r->seq; }
}

// The call of id completes later, at a wait (CPU: a non-blocking MPI call); flight_wait: the rank waits for it now
// (it is the call the rank waits in, though older ones may not have been waited for yet).
static void flight_async(uint64_t id) {
    if (id == 0) { return; }
    FlightRecord *r = flight_slot(id - 1);
    if (r->index == id - 1) { r->flags |= FL_ASYNC; }
}
static void flight_wait(uint64_t id) {
    if (id == 0) { return; }
    FlightRecord *r = flight_slot(id - 1);
    if (r->index == id - 1) { r->flags &= ~FL_ASYNC; }
}

#ifdef USE_CUDA
// CUDA: a device call is complete when an event recorded on its stream after it is; one event per ring slot, made
// at its first use. flight_poll asks them without waiting (at each call, and before a diagnosis).
static cudaEvent_t *flight_events = NULL;
static int flight_device = 0;   // (the events' device: the watchdog's thread queries them there)
static void flight_done_on_stream(uint64_t id, cudaStream_t stream) {
    FlightHeader *h = flight_header();
    if (id == 0) { return; }
    if (flight_events == NULL && cudaGetDevice(&flight_device) == cudaSuccess) {
        flight_events = (cudaEvent_t *)calloc(h->capacity, sizeof(cudaEvent_t));
    }
    cudaEvent_t *e = flight_events ? &flight_events[(id - 1) % h->capacity] : NULL;
    if (e == NULL || (*e == NULL && cudaEventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess) ||
        cudaEventRecord(*e, stream) != cudaSuccess) {
        return;   // (its completion stays unknown)
    }
    flight_slot(id - 1)->flags |= FL_DEVICE;
}

static void flight_poll(void) {
    FlightHeader *h = flight_header();
    uint64_t end = h->written, i = flight.unresolved;
    if (flight_events == NULL) { return; }
    if (end > (uint64_t)h->capacity && i < end - h->capacity) { i = end - h->capacity; }
    int all_resolved = 1;
    cudaSetDevice(flight_device);
    for (; i < end; i++) {
        FlightRecord *r = flight_slot(i);
        if (r->index != i || !(r->flags & FL_DEVICE) || r->done != 0.0) {
            if (all_resolved) { flight.unresolved = i + 1; }
            continue;
        }
        if (cudaEventQuery(flight_events[i % h->capacity]) == cudaSuccess) {
            flight_done(i + 1);
            if (all_resolved) { flight.unresolved = i + 1; }
        } else {
            all_resolved = 0;
        }
    }
}
#else
static void flight_poll(void) {}
#endif

// The watchdog's second test (guard.h), for the waits it does not watch: CUDA's host thread blocks behind the device
// not only in the synchronisations (watched) but wherever a call waits for the stream (a copy to pageable memory, a
// kernel launch once the launch queue is full, a library call that synchronises): a device call (FL_DEVICE) not seen
// complete, posted `age` seconds ago, with no sign of the host's progress since (flight_host_seen), inside a step or
// an evaluation (their host work only queues device work and waits; set-up, a checkpoint and the end may keep the
// host busy for long on its own). Returns the record's id (0: none) and *age: the time since the later of its post
// and the host's last progress. (The CPU build: no device calls, 0.)
static uint64_t flight_device_stall(double *age) {
    FlightHeader *h = flight_header();
    uint64_t end = h->written, i = flight.unresolved;
    int phase = h->now.phase;
    *age = 0.0;
    if (phase == PH_SETUP || phase == PH_CHECKPOINT || phase == PH_END || phase < 0 || phase >= PH_N) { return 0; }
    if (end > (uint64_t)h->capacity && i < end - h->capacity) { i = end - h->capacity; }
    for (; i < end; i++) {
        FlightRecord *r = flight_slot(i);
        if (r->index != i || !(r->flags & FL_DEVICE) || r->done != 0.0) { continue; }
        double seen = flight_host_seen, since = r->posted > seen ? r->posted : seen;
        *age = flight_clock() - since;
        return i + 1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// what the rank is doing, and how it ends (the model's code sets the context; comm.h, guard.h, utils.h the rest)

static void flight_step(int step) {
    FlightHeader *h = flight_header();
    h->now = (FlightContext){step, -1, FL_LAYER_NONE, PH_FORWARD};
    flight_host_seen = flight_clock();
}
static void flight_at(int phase, int micro, int layer) {
    FlightHeader *h = flight_header();
    h->now.phase = phase;
    h->now.micro = (int16_t)micro;
    h->now.layer = (int16_t)layer;
    flight_host_seen = flight_clock();
}
static void flight_layer(int layer) { flight_header()->now.layer = (int16_t)layer; flight_host_seen = flight_clock(); }

// The rank's place once MPI says it (the launcher may not have).
static void flight_rank(int rank, int world) { flight_header()->rank = rank; flight_header()->world = world; }

// The watchdog's thread, a few times a second: this rank still runs (and, CUDA, which device calls completed).
static void flight_beat(void) {
    if (flight.base == NULL) { return; }
    flight_header()->heartbeat = flight_clock();
    flight_poll();
}

// A signal arrived (async-signal-safe: stores and clock_gettime).
static void flight_signal(int sig) {
    FlightHeader *h = flight_header();
    h->signal = sig;
    h->signalled = flight_clock();
}

// Rank 0's long file work, while every rank waits with it (run_dir.h): what it is and when it last progressed;
// what "" when it is over.
static void flight_io(const char *what, double since_monotonic_age) {
    FlightHeader *h = flight_header();
    snprintf(h->io_what, sizeof(h->io_what), "%s", what);
    h->io_since = flight_clock() - since_monotonic_age;
}

// How the recording ends (the first end counts): the kind and its words.
static void flight_end(int end, const char *why) {
    FlightHeader *h = flight_header();
    if (h->end != FL_RUNNING) { return; }
    snprintf(h->why, sizeof(h->why), "%s", why ? why : "");
    size_t n = strlen(h->why);
    while (n > 0 && h->why[n - 1] == '\n') { h->why[--n] = '\0'; }
    h->ended = flight_clock();
    h->end = end;
    if (flight.fd >= 0) { msync(flight.base, flight_bytes(h->capacity), MS_ASYNC); }
}

// The end at MPI_Finalize: the ring stays in the run directory (the last run's record); without one, after a normal
// run, its file goes (after an error it stays, for dev/flight.sh, until a later job on the host sweeps it).
static void flight_finish(void) {
    flight_end(FL_FINISHED, "MPI_Finalize");
    if (flight.path[0] && !flight.run_dir[0] && flight_header()->end == FL_FINISHED) {
        unlink(flight.path);
        rmdir(flight.job_dir);
    }
}

#endif // LLMC_FLIGHT_RECORDER_H
