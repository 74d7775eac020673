// The process grid: every rank's place and the groups it belongs to.
//   world = tp * cp * pp * dp, tp fastest, then cp: tp_rank = r % tp, cp_rank = (r / tp) % cp,
//   pp_rank = (r / (tp * cp)) % pp, dp_rank = r / (tp * cp * pp).
//   Context parallelism (cp, context_parallel.h) splits each sequence over the cp ranks of a dp rank:
//   they read the same batch and hold different tokens of it, so the gradients are summed (and ZeRO
//   shards) over the dpcp group, the cp * dp ranks with the same (tp, pp); without cp it is the dp group.
//   Expert parallelism is carved out of dp: an ep group is ep consecutive dp ranks with the same
//   (tp, cp, pp) (ep_rank = dp_rank % ep); the edp group (expert data parallel) is the dp/ep x cp ranks
//   with the same (tp, pp, ep_rank), which hold the same experts (with cp, for other tokens of the sequences).
//   Each group (tp, cp, pp, dp, dpcp, ep, edp) is an MPI communicator; on CUDA also an NCCL communicator whose
//   unique id is broadcast over that MPI communicator, and a stream of its own (comm.h: how the collectives use
//   it). (NO_MPI=1 builds: one process, every group of size 1, llmc/mpi_single.h instead of MPI and no NCCL.)
// The collectives over these groups are comm.h's.
#ifndef LLMC_GRID_H
#define LLMC_GRID_H

#include "backend.h"
#include "guard.h"
#include "test_hooks.h"

// a group of ranks: its communicators and what its calls have cost
typedef struct {
    const char *name;
    int size, rank;
    MPI_Comm mpi;
#ifdef USE_NCCL
    ncclComm_t nccl;
    cudaStream_t stream;   // this group's NCCL calls (size > 1)
    cudaEvent_t ready;     // recorded on main_stream before each call: its input is ready
#endif
    double bytes;   // ring bytes sent by this rank since comm_reset_counters
    long calls;
    double exposed; // CPU build: seconds this rank spent inside the group's MPI calls and in the waits for its
                    // asynchronous ones since comm_reset_counters (the exposed communication: no compute runs then)
    int *world_of;  // the world rank of each group rank (the recorded messages' peers, the group's instance)
    int flight;     // its number in the flight recorder (flight_group; 0: its calls are not recorded)
} Group;

// this rank's place in the grid and its groups
typedef struct {
    int world_size, rank, local_rank;
    int tp, cp, pp, dp, ep;
    int tp_rank, cp_rank, pp_rank, dp_rank, ep_rank;
    Group world, tp_group, cp_group, pp_group, dp_group, ep_group;
    Group dpcp_group;  // cp > 1: the cp * dp ranks with the same (tp, pp), over which the gradients are summed
    Group *grad_group; // the dense gradients' group: dpcp_group, or dp_group without cp
    Group edp_group;   // the ranks with the same experts: (tp, pp, ep_rank) equal (dp / ep x cp of them)
    Group emb_group;   // the first and the last pipeline stage of one (tp, dp) position: the tied wte
} Grid;

#ifdef USE_NCCL
// every NCCL communicator, so that the watchdog can abort them all (guard.h)
static ncclComm_t nccl_comms[16];
static int nccl_ncomms = 0;
static void nccl_abort_all(void) { for (int i = 0; i < nccl_ncomms; i++) { ncclCommAbort(nccl_comms[i]); } }
#endif

// --comm-streams 1 (CUDA): every group's NCCL calls on one stream, in program order: no two communicators' kernels
// ever run at once, so no order between them can go wrong (NCCL documents concurrent communicators as able to hang),
// at the price of the overlap between groups: a fallback. 0: a stream per group. (The CPU build's MPI calls run in
// program order on the rank's one thread either way.)
static int comm_one_stream = 0;
#ifdef USE_NCCL
static cudaStream_t comm_shared_stream = NULL;
#endif

static void group_init(Group *g, const char *name, int color, int key) {
    g->name = name;
    g->bytes = 0;
    g->calls = 0;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->mpi);
    MPI_Comm_size(g->mpi, &g->size);
    MPI_Comm_rank(g->mpi, &g->rank);
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    g->world_of = (int *)malloc_check(sizeof(int) * g->size);
    MPI_Allgather(&world_rank, 1, MPI_INT, g->world_of, 1, MPI_INT, g->mpi);
    g->flight = flight_group(name, g->size, g->rank, g->world_of);
#ifdef USE_NCCL
    // an NCCL communicator only where NCCL can be called: collectives on one rank return early
    g->nccl = NULL;
    if (g->size > 1) {
        ncclUniqueId id;
        if (g->rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
        MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g->mpi);
        ncclCheck(ncclCommInitRank(&g->nccl, g->size, id, g->rank));
        if (comm_one_stream && comm_shared_stream == NULL) {
            cudaCheck(cudaStreamCreateWithFlags(&comm_shared_stream, cudaStreamNonBlocking));
        }
        if (comm_one_stream) { g->stream = comm_shared_stream; }
        else { cudaCheck(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)); }
        cudaCheck(cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming));
        if (nccl_ncomms < 16) { nccl_comms[nccl_ncomms++] = g->nccl; }
        watch_abort = nccl_abort_all;
    }
#endif
}

// A warning (rank 0, once) for a tp or ep group whose ranks are on more than one node: their collectives, on
// the critical path of every layer, then cross the network. node: this rank's node's id.
static void grid_warn_spanning(Grid *grid, int node) {
    Group *groups[2] = {&grid->tp_group, &grid->ep_group};
    int spans[2];
    for (int i = 0; i < 2; i++) {
        int lo = node, hi = node;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, groups[i]->mpi);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, groups[i]->mpi);
        spans[i] = lo != hi;
    }
    MPI_Allreduce(MPI_IN_PLACE, spans, 2, MPI_INT, MPI_MAX, grid->world.mpi);
    for (int i = 0; i < 2 && grid->rank == 0; i++) {
        if (!spans[i]) { continue; }
        printf("warning: %s groups span nodes: their collectives cross the network (ranks are laid out tp fastest, "
               "then cp, pp, dp, with ep inside dp: keep %s within the ranks of a node; --plan-search "
               "--gpus-per-node G ranks the layouts)\n", groups[i]->name, i == 0 ? "--tp" : "--tp x --cp x --pp x --ep");
        fflush(stdout);
    }
}

// Rank 0 prints where every rank runs: per host, its ranks and their node-local ranks (the GPU each one takes), as
// "hosts: a ranks 0-7 (local 0-7); b ranks 8-15 (local 0-7)" (a run of consecutive ranks with consecutive local
// ranks is one range), so a hostfile or Slurm placement can be checked against the layout's order.
static void grid_print_hosts(int rank, int world, int local_rank) {
    typedef struct { char host[64]; int local; } Where;
    Where me, *all = rank == 0 ? (Where *)calloc(world, sizeof(Where)) : NULL;
    memset(&me, 0, sizeof(me));
    gethostname(me.host, sizeof(me.host) - 1);
    me.local = local_rank;
    MPI_Gather(&me, (int)sizeof(me), MPI_BYTE, all, (int)sizeof(me), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank != 0) { return; }
    printf("hosts:");
    int *said = (int *)calloc(world, sizeof(int));
    for (int r = 0, nh = 0; all && said && r < world; r++) {
        if (said[r]) { continue; }
        int n = 0;
        for (int i = r; i < world; i++) { n += !strcmp(all[i].host, all[r].host); }
        printf("%s %s rank%s ", nh++ ? ";" : "", all[r].host, n > 1 ? "s" : "");
        for (int i = r, first = 1; i < world; i++) {
            if (said[i] || strcmp(all[i].host, all[r].host) != 0) { continue; }
            int j = i;   // a run: consecutive ranks on this host with consecutive local ranks
            while (j + 1 < world && !strcmp(all[j + 1].host, all[r].host) && all[j + 1].local == all[j].local + 1) { j++; }
            for (int k = i; k <= j; k++) { said[k] = 1; }
            if (j > i) { printf("%s%d-%d (local %d-%d)", first ? "" : ", ", i, j, all[i].local, all[j].local); }
            else { printf("%s%d (local %d)", first ? "" : ", ", i, all[i].local); }
            first = 0;
            i = j;
        }
    }
    printf("\n");
    fflush(stdout);
    free(said);
    free(all);
}

// Builds every group of the grid. Call after the sizes were validated (layout.h's layout_error).
static void grid_init(Grid *grid, int tp, int cp, int pp, int ep) {
    MPI_Comm_size(MPI_COMM_WORLD, &grid->world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &grid->rank);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, grid->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &grid->local_rank);
    int node = grid->rank;   // this rank's node: the lowest world rank of those that share its memory
    MPI_Allreduce(MPI_IN_PLACE, &node, 1, MPI_INT, MPI_MIN, local);
    MPI_Comm_free(&local);
    grid_print_hosts(grid->rank, grid->world_size, grid->local_rank);
    int r = grid->rank;
    grid->tp = tp; grid->cp = cp; grid->pp = pp; grid->dp = grid->world_size / (tp * cp * pp); grid->ep = ep;
    grid->tp_rank = r % tp;
    grid->cp_rank = (r / tp) % cp;
    grid->pp_rank = (r / (tp * cp)) % pp;
    grid->dp_rank = r / (tp * cp * pp);
    grid->ep_rank = grid->dp_rank % ep;
    backend_init(grid->local_rank);
    int t = grid->tp_rank, c = grid->cp_rank, tc = tp * cp, tcp = tp * cp * pp;
    group_init(&grid->world, "world", 0, r);
    group_init(&grid->tp_group, "tp", r / tp, r);                                            // same (cp, pp, dp)
    group_init(&grid->cp_group, "cp", grid->dp_rank * tp * pp + grid->pp_rank * tp + t, r);   // same (tp, pp, dp)
    group_init(&grid->pp_group, "pp", grid->dp_rank * tc + c * tp + t, r);                   // same (tp, cp, dp)
    group_init(&grid->dp_group, "dp", grid->pp_rank * tc + c * tp + t, r);                   // same (tp, cp, pp)
    if (cp > 1) { group_init(&grid->dpcp_group, "dpcp", grid->pp_rank * tp + t, r); }        // same (tp, pp)
    grid->grad_group = cp > 1 ? &grid->dpcp_group : &grid->dp_group;
    group_init(&grid->ep_group, "ep", (grid->dp_rank / ep) * tcp + grid->pp_rank * tc + c * tp + t, r);
    // same (tp, pp, ep rank): cp too
    group_init(&grid->edp_group, "edp", (grid->ep_rank * pp + grid->pp_rank) * tp + t, r);
    int ends = grid->pp_rank == 0 || grid->pp_rank == pp - 1;   // middle stages: a group of their own
    group_init(&grid->emb_group, "emb", ends ? grid->dp_rank * tc + c * tp + t : grid->world_size + r, r);
    grid_warn_spanning(grid, test_hook_ranks_per_node() > 0 ? r / test_hook_ranks_per_node() : node);
}

// The grid as rank r of a world of `world` ranks would have it, without communicators (a memory plan:
// the sizes and positions only; nothing may be sent through these groups).
static void grid_plan(Grid *grid, int world, int r, int tp, int cp, int pp, int ep) {
    memset(grid, 0, sizeof(*grid));
    grid->world_size = world; grid->rank = r;
    grid->tp = tp; grid->cp = cp; grid->pp = pp; grid->dp = world / (tp * cp * pp); grid->ep = ep;
    grid->tp_rank = r % tp;
    grid->cp_rank = (r / tp) % cp;
    grid->pp_rank = (r / (tp * cp)) % pp;
    grid->dp_rank = r / (tp * cp * pp);
    grid->ep_rank = grid->dp_rank % ep;
    int dp = grid->dp, ends = pp > 1 && (grid->pp_rank == 0 || grid->pp_rank == pp - 1);
    grid->world = (Group){"world", world, r};
    grid->tp_group = (Group){"tp", tp, grid->tp_rank};
    grid->cp_group = (Group){"cp", cp, grid->cp_rank};
    grid->pp_group = (Group){"pp", pp, grid->pp_rank};
    grid->dp_group = (Group){"dp", dp, grid->dp_rank};
    grid->dpcp_group = (Group){"dpcp", cp * dp, grid->dp_rank * cp + grid->cp_rank};
    grid->grad_group = cp > 1 ? &grid->dpcp_group : &grid->dp_group;
    grid->ep_group = (Group){"ep", ep, grid->ep_rank};
    grid->edp_group = (Group){"edp", dp / ep * cp, grid->dp_rank / ep * cp + grid->cp_rank};
    grid->emb_group = (Group){"emb", ends ? 2 : 1, ends && grid->pp_rank == pp - 1 ? 1 : 0};
}

// The grid's groups (world first if asked): tp, cp, pp, dp, dpcp (only with cp), ep, edp, emb.
static int grid_groups(Grid *g, Group **out, int with_world) {
    int n = 0;
    if (with_world) { out[n++] = &g->world; }
    out[n++] = &g->tp_group; out[n++] = &g->cp_group; out[n++] = &g->pp_group; out[n++] = &g->dp_group;
    if (g->cp > 1) { out[n++] = &g->dpcp_group; }
    out[n++] = &g->ep_group; out[n++] = &g->edp_group; out[n++] = &g->emb_group;
    return n;
}

// Prints the grid and the members of every group (rank 0), as the communicators have them: each
// rank finds the lowest world rank of each of its groups, and a group is printed from that rank.
static void grid_print(Grid *g) {
    enum { NG = 8 };
    Group *groups[NG];
    int ng = grid_groups(g, groups, 0);
    int world = g->world_size, mine[NG + 5] = {g->tp_rank, g->cp_rank, g->pp_rank, g->dp_rank, g->ep_rank};
    for (int k = 0; k < ng && k < NG; k++) { MPI_Allreduce(&g->rank, &mine[5 + k], 1, MPI_INT, MPI_MIN, groups[k]->mpi); }
    int *all = (int *)malloc_check(sizeof(int) * (NG + 5) * world);
    MPI_Gather(mine, NG + 5, MPI_INT, all, NG + 5, MPI_INT, 0, MPI_COMM_WORLD);
    if (g->rank == 0) {
        printf("process grid: world %d = tp %d x cp %d x pp %d x dp %d (ep %d within dp, edp %d = dp/ep x cp), tp "
               "fastest\n", world, g->tp, g->cp,
               g->pp, g->dp, g->ep, g->dp / g->ep * g->cp);
        for (int r = 0; r < world; r++) {
            int *a = all + (NG + 5) * r;
            printf("  rank %d: tp_rank %d cp_rank %d pp_rank %d dp_rank %d ep_rank %d\n", r, a[0], a[1], a[2], a[3],
                   a[4]);
        }
        for (int k = 0; k < ng; k++) {
            printf("  %s groups:", groups[k]->name);
            for (int leader = 0; leader < world; leader++) {
                if (all[(NG + 5) * leader + 5 + k] != leader) { continue; }
                printf(" [");
                for (int r = 0, n = 0; r < world; r++) {
                    if (all[(NG + 5) * r + 5 + k] == leader) { printf(n++ ? " %d" : "%d", r); }
                }
                printf("]");
            }
            printf("\n");
        }
        fflush(stdout);
    }
    free(all);
}

static void group_free(Group *g) {
#ifdef USE_NCCL
    if (g->nccl) {
        for (int i = 0; i < nccl_ncomms; i++) {   // (no longer one to abort)
            if (nccl_comms[i] == g->nccl) { nccl_comms[i] = nccl_comms[--nccl_ncomms]; break; }
        }
        ncclCommDestroy(g->nccl);
        if (g->stream != comm_shared_stream) { cudaCheck(cudaStreamDestroy(g->stream)); }
        cudaCheck(cudaEventDestroy(g->ready));
    }
#endif
    MPI_Comm_free(&g->mpi);
    free(g->world_of);
    g->world_of = NULL;
}

static void grid_free(Grid *g) {
    Group *groups[9];
    int n = grid_groups(g, groups, 1);
    for (int i = 0; i < n; i++) { group_free(groups[i]); }
#ifdef USE_NCCL
    if (comm_shared_stream) { cudaCheck(cudaStreamDestroy(comm_shared_stream)); comm_shared_stream = NULL; }
#endif
}

#endif
