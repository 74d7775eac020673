// The flight recorder's rings of a run, after the job (dev/flight.sh builds and runs this): the diagnosis line a rank
// printed as the job ran, kept in its ring (the rings read afterwards after it: the launcher may have ended the
// others since), else the same diagnosis from the rings (llmc/flight_diagnosis.h); with --list each rank's state and
// its last calls. A ring that cannot be trusted is skipped with a line saying why.
// Use it where no rank could print the line (after a kill -9 that made mpirun end the job at once), or on the
// run directories of a multi-node job gathered into one (their flight/ folders' files side by side).
// usage: flight DIR [--list [N]]   (DIR: a run directory (-o), its flight/ folder, or a job's temporary folder)
#include "../llmc/flight_diagnosis.h"

// Reads the ring file `name` in d (a rank_NNNNN.ring of job, NULL: any job): 1 if usable. A ring that cannot be
// trusted (unreadable, a special file, a corrupt header, a header naming another rank than its file) is skipped with
// a line on stderr saying why, once (say).
static int read_ring(const char *d, const char *name, const char *job, RankRing *r, int say) {
    char path[FLIGHT_PATH];
    int rank;
    char tail[8];
    memset(r, 0, sizeof(*r));
    if (sscanf(name, "rank_%d.%7s", &rank, tail) != 2 || strcmp(tail, "ring") != 0 ||
        snprintf(path, sizeof(path), "%s/%s", d, name) >= FLIGHT_PATH) {
        return 0;
    }
    int ok = fd_read(path, job, r);
    if (ok && r->h.rank != rank) { snprintf(fd_why, sizeof(fd_why), "its header says rank %d", r->h.rank); ok = 0; }
    if (!ok && say && fd_why[0]) { fprintf(stderr, "flight: skipped %s: %s\n", path, fd_why); }
    if (!ok) { free(r->rec); memset(r, 0, sizeof(*r)); }
    return ok;
}

// The rings in dir (or dir/flight), of its newest job (the ring started last names it, and its world the job's):
// rs->r[rank]. A ring of that job naming another world is skipped with a line.
static int load_dir(Rings *rs, const char *dir) {
    char d[FLIGHT_PATH], job[64] = "";
    struct stat st;
    double newest = -1.0;
    int world = 0;
    memset(rs, 0, sizeof(*rs));
    rs->me = -1;
    gethostname(rs->host, sizeof(rs->host) - 1);
    snprintf(d, sizeof(d), "%s/flight", dir);
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) { snprintf(d, sizeof(d), "%s", dir); }
    DIR *D = opendir(d);
    struct dirent *e;
    while (D && (e = readdir(D)) != NULL) {   // the newest job and its world
        RankRing r;
        if (!read_ring(d, e->d_name, NULL, &r, 1)) { continue; }
        if (r.h.started > newest) { newest = r.h.started; memcpy(job, r.h.job, sizeof(job)); world = r.h.world; }
        free(r.rec);
    }
    if (D) { closedir(D); }
    if (world == 0) { return 0; }
    rs->world = world;
    rs->r = (RankRing *)calloc(world, sizeof(RankRing));
    D = opendir(d);
    while (rs->r && D && (e = readdir(D)) != NULL) {
        RankRing r;
        if (!read_ring(d, e->d_name, job, &r, 0)) { continue; }
        if (r.h.world != world) {
            fprintf(stderr, "flight: skipped %s/%s: world %d, its job's newest ring says %d\n", d, e->d_name, r.h.world,
                    world);
            free(r.rec);
        } else if (rs->r[r.h.rank].present) {
            free(r.rec);   // (rank_5.ring and rank_00005.ring: the first read)
        } else {
            rs->r[r.h.rank] = r;
        }
    }
    if (D) { closedir(D); }
    fd_look(rs);
    return rs->r != NULL;
}

// The diagnosis a rank printed as the job ran (kept in its ring), the earliest: -1 if none.
static int live_diagnosis(const Rings *rs) {
    int first = -1;
    for (int r = 0; r < rs->world; r++) {
        const FlightHeader *h = &rs->r[r].h;
        if (rs->r[r].present && h->diagnosis[0] && (first < 0 || h->ended < rs->r[first].h.ended)) { first = r; }
    }
    return first;
}

// One rank's state, then its last n calls, oldest first.
static void list_rank(const Rings *rs, int rank, int n) {
    const RankRing *r = &rs->r[rank];
    char text[2048];
    Line l = {text, sizeof(text), 0};
    if (!r->present) { printf("rank %d: no ring\n", rank); return; }
    fd_state(&l, r, 0);
    printf("rank %d (pid %d on %s; %s%s%s; signal %d): %s\n", rank, (int)r->h.pid, r->h.host,
           flight_end_names[r->h.end], r->h.why[0] ? ": " : "", r->h.why, (int)r->h.signal, text);
    for (int i = r->n > n ? r->n - n : 0; i < r->n; i++) {
        const FlightRecord *x = &r->rec[i];
        l.len = 0;
        fd_call(&l, r, x);
        fd_put(&l, ", %lld x %d B", (long long)x->count, x->elem);
        printf("  %8llu %s %s\n", (unsigned long long)x->index, x->done != 0.0 ? "done   " : "pending", text);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || (argc > 2 && strcmp(argv[2], "--list") != 0)) {
        fprintf(stderr, "usage: %s DIR [--list [N]]   (DIR: a run directory, its flight/ folder, or a job's temporary "
                "folder)\n", argv[0]);
        return 2;
    }
    Rings rs;
    if (!load_dir(&rs, argv[1])) {
        fprintf(stderr, "error: no ring of the flight recorder in '%s'\n", argv[1]);
        return 1;
    }
    char line[4096];
    fd_diagnose(&rs, line, sizeof(line));
    int live = live_diagnosis(&rs);
    if (live >= 0) {   // (the job's own words first: the launcher may have ended the other ranks after them)
        printf("diagnosis: %s\n", rs.r[live].h.diagnosis);
        printf("(rank %d printed it as the job ran; the rings as the job left them read: %s)\n", live, line);
    } else {
        printf("diagnosis: %s\n", line);
    }
    int n = argc > 3 ? atoi(argv[3]) : 12;
    for (int r = 0; argc > 2 && r < rs.world; r++) { list_rank(&rs, r, n); }
    fd_free(&rs);
    return 0;
}
