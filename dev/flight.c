// The flight recorder's rings of a run, after the job (dev/flight.sh builds and runs this): the same diagnosis line
// train_gpt prints when it can (llmc/flight_diagnosis.h), then with --list each rank's state and its last calls.
// Use it where no rank could print the line (after a kill -9 that made mpirun end the job at once), or on the
// run directories of a multi-node job gathered into one (their flight/ folders' files side by side).
// usage: flight DIR [--list [N]]   (DIR: a run directory (-o), its flight/ folder, or a job's temporary folder)
#include "../llmc/flight_diagnosis.h"

// The rings in dir (or dir/flight), of its newest job (the ring started last names it): rs->r[rank].
static int load_dir(Rings *rs, const char *dir) {
    char d[FLIGHT_PATH], path[FLIGHT_PATH], job[64] = "";
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
        memset(&r, 0, sizeof(r));
        if (strncmp(e->d_name, "rank_", 5) != 0 || snprintf(path, sizeof(path), "%s/%s", d, e->d_name) >= FLIGHT_PATH ||
            !fd_read(path, NULL, &r)) {
            continue;
        }
        if (r.h.started > newest) { newest = r.h.started; memcpy(job, r.h.job, sizeof(job)); }
        free(r.rec);
    }
    if (D) { rewinddir(D); }
    while (D && (e = readdir(D)) != NULL) {
        RankRing r;
        memset(&r, 0, sizeof(r));
        if (strncmp(e->d_name, "rank_", 5) != 0 || snprintf(path, sizeof(path), "%s/%s", d, e->d_name) >= FLIGHT_PATH ||
            !fd_read(path, job, &r)) {
            continue;
        }
        if (r.h.world > world) { world = r.h.world; }
        if (r.h.rank + 1 > world) { world = r.h.rank + 1; }
        free(r.rec);
    }
    if (D) { closedir(D); }
    if (world == 0) { return 0; }
    rs->world = world;
    rs->r = (RankRing *)calloc(world, sizeof(RankRing));
    for (int i = 0; rs->r && i < world; i++) {
        if (flight_ring_name(path, sizeof(path), d, i)) { fd_read(path, job, &rs->r[i]); }
    }
    fd_look(rs);
    return rs->r != NULL;
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
    printf("diagnosis: %s\n", line);
    int n = argc > 3 ? atoi(argv[3]) : 12;
    for (int r = 0; argc > 2 && r < rs.world; r++) { list_rank(&rs, r, n); }
    fd_free(&rs);
    return 0;
}
