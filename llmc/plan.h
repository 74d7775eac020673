// The memory plan (--plan N, --memory-limit): any rank's peak bytes per category for any world size and
// flags, from the code that allocates: gpt2_init runs with the allocator only
// counting (alloc.h) on a grid without communicators (grid_plan): no weights, no device, one process.
// The plan itself is gpt2_plan (train_gpt.cu: it runs the model's own set-up); this file has what is
// built on it: the report per stage, what dominates a category, a cost model of a step's time, and the
// levers (one change of the layout at a time, or pairs) ranked by fit and time.
#ifndef LLMC_PLAN_H
#define LLMC_PLAN_H

#include "utils.h"
#include "alloc.h"
#include "comm.h"
#include "attention.h"
#include "pipeline.h"
#include "model_file.h"
#include "args.h"

typedef struct { size_t floatx; int cuda; const char *name; } PlanBuild;   // the build planned for

static PlanBuild plan_build(const Args *a) {
#ifdef USE_CUDA
    PlanBuild b = {sizeof(floatX), 1,
                   sizeof(floatX) == 2 ? "CUDA build, bf16 (AdamW state and master weights fp32)" : "CUDA build, fp32"};
#else
    PlanBuild b = {sizeof(floatX), 0, "CPU build, fp32"};
#endif
    if (a->plan_precision
        && !strcmp(a->plan_precision,
                   "bf16")) { b = (PlanBuild){2, 1, "CUDA build, bf16 (AdamW state and master weights fp32)"}; }
    if (a->plan_precision && !strcmp(a->plan_precision, "fp32")) { b = (PlanBuild){4, 1, "CUDA build, fp32"}; }
    return b;
}

// The plan of rank `rank` of a world of `world` ranks (train_gpt.cu).
// shape (if not NULL): the rank's shapes its step's bytes follow from (comm_bytes.h).
static MemPlan gpt2_plan(const Args *a, const GPT2Config *c, MoEOptions moe, int world, int rank, PlanBuild b,
                         CommShape *shape);

// What the CUDA context and NCCL take beside the allocator's buffers (an assumption, stated with the plan).
static double plan_reserve(PlanBuild b) { return b.cuda ? 1024.0 * 1048576.0 : 0.0; }

// The plan of every pipeline stage (tp, cp, dp rank 0 of each: the other positions hold as much), and its
// shapes for the cost model (shapes: NULL, or pp of them); returns the stage with the largest peak total.
static int plan_stages(const Args *a, const GPT2Config *c, int world, PlanBuild b, MemPlan *plans, CommShape *shapes) {
    int worst = 0;
    for (int s = 0; s < a->pp; s++) {
        plans[s] = gpt2_plan(a, c, moe_options(a, c), world, s * a->tp * a->cp, b, shapes ? &shapes[s] : NULL);
    }
    for (int s = 1; s < a->pp; s++) { if (plans[s].peak_total > plans[worst].peak_total) { worst = s; } }
    return worst;
}

static double gib(double bytes) { return bytes / 1073741824.0; }

// What dominates a category of the plan, in words (for the advice).
static void plan_explain(const Args *a, const GPT2Config *c, int world, int stage, int cat, PlanBuild b, int slots,
                         char *out, size_t n) {
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp), layers = 0;
    int first[PIPE_MAX_LAYERS + 1];
    char err[256];
    if (layer_split(first, a->pp_layers, c, a->T, a->pp, a->vpp, err, sizeof(err))) { fail("%s", err); }
    for (int v = 0; v < a->vpp; v++) { layers += first[v * a->pp + stage + 1] - first[v * a->pp + stage]; }
    double X = (double)b.floatx, BT = (double)a->B * a->T / a->cp, P = (double)num_parameters(c) / a->pp / a->tp;
    switch (cat) {
    case MEM_PARAMS: snprintf(out, n, "parameters: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                              a->zero == 3 ? " / dp (ZeRO 3)" : ", a full copy on every dp rank"); break;
    case MEM_GRADS: snprintf(out, n, "gradients: about P/(pp tp) = %.0fM x %.0f B%s", P / 1e6, X,
                             a->zero >= 2 ? " / dp (ZeRO 2-3)" : ", a full copy on every dp rank"); break;
    case MEM_OPTIMIZER: snprintf(out, n, "AdamW m, v%s: %d B per parameter%s",
                                 b.floatx == 2 ? " and fp32 master weights" : "", b.floatx == 2 ? 12 : 8,
                                 a->zero >= 1 ? " / dp (ZeRO 1-3)"
                                         : " for every parameter of the stage (ZeRO 0)"); break;
    case MEM_ACTIVATIONS: snprintf(out, n,
                                   "activations: %d micro-batch(es)%s of B %d x T/cp %.0f tokens in flight on stage %d (%s, %d micro-batches), %d layers each%s%s",
                                   slots, a->vpp > 1 ? " x model chunks" : "", a->B, BT / a->B, stage, a->pp_schedule,
                                       accum, layers,
                                   a->tp > 1 && !a->sp ? ", the LayerNorm/residual part replicated over tp (no --sp)"
                                           : "", strcmp(a->recompute, "none") ? "" : ", nothing recomputed"); break;
    case MEM_LOGITS: snprintf(out, n, "logits: %s x Vp/tp = %d x %d x %.0f B",
                              a->ce_chunk == 0 ? "all B*T/cp tokens (--ce-chunk 0)" : "one CE chunk",
                              a->ce_chunk == 0 || a->ce_chunk > BT ? (int)BT : a->ce_chunk,
                                  c->padded_vocab_size / a->tp, X); break;
    case MEM_COMM: snprintf(out, n,
                            "comm buffers: MoE dispatch rows, the cp ring's k, v, or pipeline gradient copies"); break;
    default: snprintf(out, n, "workspace: %s",
                      b.cuda && a->cp == 1
                      ? "cuBLAS attention scores (NH/tp, T, T) in fp32 and floatX, and the layers' scratch"
                                                                    : "one layer's scratch (B*T, 4C/tp)"); break;
    }
}

// ----------------------------------------------------------------------------
// The cost model: a step's seconds from the machine's rates (Machine: --machine FILE, or the defaults), the
// plan's exact shapes per stage (each stage's layers and head, its bytes per group: comm_bytes.h), and the
// pipeline's own step list (pipe_simulate runs the schedule the run executes). A ranking of layouts, stated
// with its assumptions; dev/notes/layout_search.md says how it was checked.

typedef struct {
    double flops;         // FLOP/s per rank on the matrix multiplies (layers, head)
    double flops_at[MACHINE_ROWS];   // flops_R: the same at GEMMs of R = 2^i rows (0: not given; between two
                                     // given, log-linear; outside, the nearest; none given: flops)
    double attn_flops;    // FLOP/s per rank on causal attention's T x T work (6 C T a token)
    double mem_bw;        // bytes/s per rank of the bandwidth-bound kernels (LayerNorm, residual, GELU, AdamW)
    double node_bw;       // bytes/s per rank a ring collective (all-reduce, reduce-scatter, all-gather) moves in a node
    double a2a_bw;        // bytes/s per rank an all-to-all sends inside a node (0: node_bw's)
    double p2p_bw;        // bytes/s per rank a send/receive exchange sends inside a node (0: node_bw's)
    double node_lat;      // seconds per call of a ring collective in a node, whatever its size (its latency)
    double a2a_lat;       // seconds per all-to-all in a node (0: node_lat's)
    double p2p_lat;       // seconds per message of a send/receive exchange in a node (0: node_lat's)
    double at[6][8];      // the six per group size 2^i (node_bw_P, a2a_bw_P, p2p_bw_P, node_lat_P, a2a_lat_P,
                          // p2p_lat_P; 0: the size-less key's)
    double net_bw;        // bytes/s per rank a collective moves across nodes
    double net_lat;       // seconds per call of a collective across nodes
    double layer_cost;    // seconds per layer and micro-batch, forward and backward (its kernels' launches)
    double adamw;         // parameters per second of the optimizer, the clip norm's pass included (0: its bytes
                          // at mem_bw: parameter, gradient, m, v and the bf16 build's fp32 master, read and written)
    double flash_slower;  // --attention flash: its attention at 1/this of attn_flops
    double cores;         // CPU ranks: the cores the ranks share (0: a device per rank)
    double overlap;       // the share of a collective posted beside compute that the compute hides (1: NCCL on its
                          // own stream; CPU ranks: MPI progresses on the rank's own core, --calibrate measures it)
    int gpus_per_node;    // ranks per node (groups within it use node_bw)
    char given[1024];     // the keys a machine file set (the others: the defaults)
    const char *name;
} Machine;

// The default: an 8-GPU H200 node (NVLink) on an InfiniBand network. flops: about 20% of the H200's dense bf16
// peak (989 TFLOP/s), what this program's GPU check reached on GPT-2 124M (22% MFU); attn_flops: half that;
// mem_bw: about 2/3 of the H200's 4.8 TB/s HBM3e; node_bw: NCCL's all-reduce bus bandwidth on an H100/H200
// NVLink node, about 360-480 GB/s in nccl-tests (NVLink 4: 450 GB/s each way), taken at 300; a2a_bw, p2p_bw:
// the same (the NVSwitch gives every pair the full NVLink bandwidth: 0, node_bw's); node_lat: a small all-reduce
// on an H100 node takes about 6-10 us in nccl-tests (NVIDIA/nccl issues 583, 1259), taken at 10; p2p_lat: a
// small send/receive about 4 us (issue 1984), taken at 5; a2a_lat: node_lat's; net_bw: one 400 Gb/s
// ConnectX-7 port per GPU (50 GB/s), taken at 40; net_lat: a few us of InfiniBand per hop on top, taken at 25;
// layer_cost: the launches of a layer's ~20 kernels at a few us each; overlap: NCCL runs on its own stream, so
// a collective posted before compute runs beside it.
static Machine machine_default(void) {
    Machine m = {200e12, {0}, 100e12, 3.0e12, 300e9, 0, 0, 10e-6, 0, 5e-6, {{0}}, 40e9, 25e-6, 50e-6, 0, 3.0, 0, 1.0,
                 8, "", "an 8 x H200 node, InfiniBand between nodes (defaults)"};
    return m;
}

// The GEMM rate at R rows (a micro-batch's tokens on the rank): flops_R where given, log-linear between the two
// nearest given, the nearest outside them, flops when none is.
static double machine_flops(const Machine *m, double rows) {
    int lo = -1, hi = -1;
    double x = log2(rows > 1 ? rows : 1);
    for (int i = 0; i < MACHINE_ROWS; i++) {
        if (m->flops_at[i] <= 0) { continue; }
        if (i <= x) { lo = i; }
        if (i >= x && hi < 0) { hi = i; }
    }
    if (lo < 0 && hi < 0) { return m->flops; }
    if (lo < 0 || hi == lo) { return m->flops_at[lo < 0 ? hi : lo]; }
    if (hi < 0) { return m->flops_at[lo]; }
    double u = (x - lo) / (hi - lo);
    return exp((1 - u) * log(m->flops_at[lo]) + u * log(m->flops_at[hi]));
}

static int ends_with(const char *s, const char *end) {
    size_t n = strlen(s), e = strlen(end);
    return n >= e && !strcmp(s + n - e, end);
}

// --machine FILE: key=value lines (# comments); unknown keys and bad values are errors (a size-less latency may be 0).
static int machine_read(Machine *m, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "--machine %s: cannot open it", path); return 1; }
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        n++;
        char *h = strchr(line, '#');
        if (h) { *h = '\0'; }
        char key[64];
        double v;
        if (sscanf(line, " %63[^= \t] = %lf", key, &v) != 2) {
            int blank = 1;
            for (char *c = line; *c; c++) { blank &= isspace((unsigned char)*c) != 0; }
            if (blank) { continue; }
            line[strcspn(line, "\r\n")] = '\0';
            snprintf(err, errlen, "--machine %s line %d: expected key=value (a number), got '%.60s'", path, n, line);
            fclose(f);
            return 1;
        }
        double *d = !strcmp(key, "flops") ? &m->flops : !strcmp(key, "attn_flops") ? &m->attn_flops
                : !strcmp(key, "mem_bw") ? &m->mem_bw : !strcmp(key, "node_bw") ? &m->node_bw
                : !strcmp(key, "a2a_bw") ? &m->a2a_bw : !strcmp(key, "p2p_bw") ? &m->p2p_bw
                : !strcmp(key, "node_lat") ? &m->node_lat : !strcmp(key, "a2a_lat") ? &m->a2a_lat
                : !strcmp(key, "p2p_lat") ? &m->p2p_lat : !strcmp(key, "net_lat") ? &m->net_lat
                : !strcmp(key, "net_bw") ? &m->net_bw : !strcmp(key, "layer_cost") ? &m->layer_cost
                : !strcmp(key, "adamw") ? &m->adamw
                : !strcmp(key, "flash_slower") ? &m->flash_slower : !strcmp(key, "cores") ? &m->cores
                : !strcmp(key, "overlap") ? &m->overlap : NULL;
        if (!d && !strncmp(key, "flops_", 6)) {   // (per GEMM rows: flops_512)
            char *end;
            long r = strtol(key + 6, &end, 10);
            int i = 0;
            while (i < MACHINE_ROWS - 1 && (1L << i) < r) { i++; }
            if (*end || r != 1L << i) {
                snprintf(err, errlen, "--machine %s line %d: '%s': the rows after flops_ must be 1, 2, 4, ... or %ld",
                         path, n, key, 1L << (MACHINE_ROWS - 1));
                fclose(f);
                return 1;
            }
            d = &m->flops_at[i];
        }
        static const char *kinds[6] = {"node_bw_", "a2a_bw_", "p2p_bw_", "node_lat_", "a2a_lat_", "p2p_lat_"};
        for (int k = 0; k < 6 && !d; k++) {   // (per group size: node_bw_4)
            size_t kl = strlen(kinds[k]);
            if (strncmp(key, kinds[k], kl)) { continue; }
            char *end;
            long p = strtol(key + kl, &end, 10);
            int i = 1;
            while (i < 7 && (1L << i) < p) { i++; }
            if (*end || p != 1L << i) {
                snprintf(err, errlen, "--machine %s line %d: '%s': the group size after %s must be 2, 4, ... or 128",
                         path, n, key, kinds[k]);
                fclose(f);
                return 1;
            }
            d = &m->at[k][i];
        }
        if (!d && strcmp(key, "gpus_per_node")) {
            snprintf(err, errlen, "--machine %s line %d: unknown key '%s' (known: %s)", path, n, key, MACHINE_KEYS);
            fclose(f);
            return 1;
        }
        if (!(v >= 0) || (v == 0 && strcmp(key, "cores") && strcmp(key, "layer_cost") && strcmp(key, "overlap") &&
                          !ends_with(key, "_lat"))) {
            snprintf(err, errlen, "--machine %s line %d: %s = %g must be positive", path, n, key, v);
            fclose(f);
            return 1;
        }
        if (!strcmp(key, "overlap") && v > 1) {
            snprintf(err, errlen, "--machine %s line %d: overlap = %g must be between 0 and 1", path, n, v);
            fclose(f);
            return 1;
        }
        if (d) { *d = v; } else { m->gpus_per_node = (int)v; }
        size_t o = strlen(m->given);
        snprintf(m->given + o, sizeof(m->given) - o, "%s%s", o ? " " : "", key);
    }
    fclose(f);
    m->name = path;
    return 0;
}

// The machine of --machine FILE (each key it lacks: the default's), with --gpus-per-node over its own.
static Machine plan_machine(const Args *a) {
    Machine m = machine_default();
    char err[512];
    if (a->machine && machine_read(&m, a->machine, err, sizeof(err))) { fail("%s", err); }
    if (a->gpus_per_node > 0) { m.gpus_per_node = a->gpus_per_node; }
    return m;
}

// A group's bandwidth: its kind's (COMM_RING: all-reduce, reduce-scatter, all-gather; COMM_A2A; COMM_P2P) at its
// size (a machine file's per-size key, else the kind's key, else node_bw), or the network's where its members,
// within `extent` consecutive ranks (tp: tp; cp: tp cp; pp: tp cp pp; ep: tp cp pp ep; dp: the world), cross
// nodes of G ranks. group_lat: its seconds per call, found the same way (node_lat, net_lat).
enum { COMM_RING, COMM_A2A, COMM_P2P };
static double group_bw(const Machine *m, int kind, int size, long extent) {
    if (size > 1 && m->gpus_per_node > 0 && extent > m->gpus_per_node) { return m->net_bw; }
    for (int i = 1; i < 8; i++) { if (size == 1 << i && m->at[kind][i] > 0) { return m->at[kind][i]; } }
    double bw = kind == COMM_A2A ? m->a2a_bw : kind == COMM_P2P ? m->p2p_bw : m->node_bw;
    return bw > 0 ? bw : m->node_bw;
}
static double group_lat(const Machine *m, int kind, int size, long extent) {
    if (size > 1 && m->gpus_per_node > 0 && extent > m->gpus_per_node) { return m->net_lat; }
    for (int i = 1; i < 8; i++) { if (size == 1 << i && m->at[3 + kind][i] > 0) { return m->at[3 + kind][i]; } }
    double lat = kind == COMM_A2A ? m->a2a_lat : kind == COMM_P2P ? m->p2p_lat : m->node_lat;
    return lat > 0 ? lat : m->node_lat;
}

// A step's time and where it goes (seconds; the comm: what is not overlapped with compute).
typedef struct { double total, compute, bubble, tp, cp, ep, pp, dp, optimizer; int stage; } StepTime;

// More ranks than cores (CPU ranks): the ranks are bound to the cores round-robin, as mpirun --map-by core
// places them (rank r on core r mod cores). The pipeline the model runs is that of the first ranks: stage s's
// rank s tp cp. core[s] is its core (numbered by first use, 0 to pp-1), weight[s] how many ranks of stage s share
// that core (they compute at the same time: the other pipelines' copies of the stage); the ranks of other stages
// on it compute between (pipe_simulate shares the core among them). Returns 0 (and sets nothing) when every rank
// has a core of its own.
static int stage_cores(const Args *a, int world, double cores, int *core, double *weight) {
    int nc = (int)cores, tc = a->tp * a->cp, ids[PIPE_MAX_LAYERS], nid = 0;
    if (cores <= 0 || world <= cores || nc < 1) { return 0; }
    for (int s = 0; s < a->pp; s++) {
        int c = (s * tc) % nc, k = 0;
        while (k < nid && ids[k] != c) { k++; }
        if (k == nid) { ids[nid++] = c; }
        core[s] = k;
        weight[s] = 0;
        for (int q = c; q < world; q += nc) { weight[s] += (q / tc) % a->pp == s; }
    }
    return 1;
}

// Seconds per step of layout a (world ranks, its plan's CommShape per stage in shapes).
static StepTime plan_step_time(const Args *a, const GPT2Config *c, int world, const Machine *mc,
                               const CommShape *shapes) {
    StepTime t;
    memset(&t, 0, sizeof(t));
    int dp = world / (a->tp * a->cp * a->pp), accum = a->total_batch / (a->B * a->T * dp), n = a->pp * a->vpp;
    int first[PIPE_MAX_LAYERS + 1];
    char err[256];
    if (layer_split(first, a->pp_layers, c, a->T, a->pp, a->vpp, err, sizeof(err))) { fail("%s", err); }
    double C = c->channels, T = a->T, X = shapes[0].X, tokens = (double)a->B * a->T / a->cp;   // a micro-batch's, a rank's
    int full = !strcmp(a->recompute, "full"), mlp = !strcmp(a->recompute, "mlp");
    double flash = !strcmp(a->attention, "flash") ? mc->flash_slower : 1.0;
    double ov = mc->overlap;   // the share of a collective that compute beside it hides
    double slow = mc->cores > 0 && world > mc->cores ? world / mc->cores : 1.0;   // ranks sharing the cores
    double tf[PIPE_MAX_LAYERS] = {0}, tb[PIPE_MAX_LAYERS] = {0}, tw[PIPE_MAX_LAYERS] = {0};   // each stage's, per micro-batch
    double busy = 0, p2p = 0;                           // the slowest stage's, per micro-batch
    double stage_busy[PIPE_MAX_LAYERS];                 // each stage's compute and exposed comm in a step
    int core[PIPE_MAX_LAYERS];                          // more ranks than cores: each stage's core and its ranks on
    double share[PIPE_MAX_LAYERS];                      // it (stage_cores), else 1
    int shared = stage_cores(a, world, mc->cores, core, share);
    if (!shared) { for (int s = 0; s < a->pp; s++) { share[s] = 1; } }
    CommBytes stage_bytes[PIPE_MAX_LAYERS], stage_calls[PIPE_MAX_LAYERS];   // each stage's per group in a step
    long tcp = (long)a->tp * a->cp;
    double bw_tp = group_bw(mc, COMM_RING, a->tp, a->tp), bw_cp = group_bw(mc, COMM_P2P, a->cp, tcp);
    double bw_pp = group_bw(mc, COMM_P2P, a->pp, tcp * a->pp), bw_ep = group_bw(mc, COMM_A2A, a->ep, tcp * a->pp * a->ep);
    double bw_dp = group_bw(mc, COMM_RING, dp * a->cp, world), bw_emb = group_bw(mc, COMM_RING, 2, tcp * a->pp);
    double lat_tp = group_lat(mc, COMM_RING, a->tp, a->tp), lat_cp = group_lat(mc, COMM_P2P, a->cp, tcp);
    double lat_pp = group_lat(mc, COMM_P2P, a->pp, tcp * a->pp), lat_ep = group_lat(mc, COMM_A2A, a->ep, tcp * a->pp * a->ep);
    double lat_dp = group_lat(mc, COMM_RING, dp * a->cp, world), lat_emb = group_lat(mc, COMM_RING, 2, tcp * a->pp);
    for (int s = 0; s < a->pp; s++) {
        const CommShape *sh = &shapes[s];
        double gemm = 0, attn = 0, layers = 0;   // FLOPs per token of the stage (this tp rank: / tp)
        for (int v = s; v < n; v += a->pp) {
            for (int l = first[v]; l < first[v + 1]; l++) {
                gemm += layer_flops_per_token(c, l, a->T) - 6.0 * C * T;
                attn += 6.0 * C * T / 2;   // (causal: half the T x T blocks)
                layers++;
            }
            if (v == n - 1) { gemm += head_flops_per_token(c); }
        }
        double g = tokens * gemm / a->tp / machine_flops(mc, tokens), at = tokens * attn / a->tp / mc->attn_flops * flash;
        // bandwidth-bound: each layer's LayerNorms, residuals, GELU, softmax read and write about 40 (BTs, C)
        double elem = layers * 40.0 * tokens / (a->sp ? a->tp : 1) * C * X / mc->mem_bw;
        double fixed = layers * mc->layer_cost;
        // each group's seconds per micro-batch: its bytes at its bandwidth, and a latency per call (the cp ring's
        // hops overlap attention, as far as the machine overlaps)
        CommBytes cb = comm_step_bytes(sh, accum, comm_ep_rows_even(sh, accum), NULL), cn = comm_step_calls(sh, accum, NULL);
        stage_bytes[s] = cb;
        stage_calls[s] = cn;
        double ctp = (cb.tp / bw_tp + cn.tp * lat_tp) / accum, cep = (cb.ep / bw_ep + cn.ep * lat_ep) / accum;
        double ccp = (cb.cp / bw_cp + cn.cp * lat_cp) / accum, cp_exposed = ccp - ov * fmin(ccp, at);
        // forward a third of the compute, backward two thirds (B: the inputs' gradients, W: the weights');
        // recompute: mlp runs fc and GELU again (an eighth of a dense layer's GEMMs), full the whole forward
        double fwd = (g + at) / 3 + elem / 3 + fixed / 3;
        double again = full ? fwd : mlp ? g / 3 / 8 : 0;
        double f = fwd + (ctp + cep) / 2 + cp_exposed / 2;
        double bwd = 2 * (g + at) / 3 + 2 * elem / 3 + 2 * fixed / 3 + again + (ctp + cep) / 2 + cp_exposed / 2;
        double w = g / 3;   // (the W pass: the weights' gradients, a forward's GEMMs)
        stage_busy[s] = accum * (f + bwd) + cb.pp / bw_pp + cn.pp * lat_pp;
        tf[s] = f; tb[s] = bwd - w; tw[s] = w;
        if ((f + bwd) * share[s] > busy) { busy = (f + bwd) * share[s]; t.stage = s; }
        t.tp = fmax(t.tp, accum * ctp); t.ep = fmax(t.ep, accum * cep); t.cp = fmax(t.cp, accum * cp_exposed);
        p2p = fmax(p2p, (cb.pp / bw_pp + cn.pp * lat_pp) / accum / 2);   // one way's messages of a micro-batch
    }
    t.compute = accum * busy - t.tp - t.ep - t.cp;
    // the pipeline: each stage's passes through the schedule's own step lists (each message on the critical
    // path; interleaved: a chunk's passes a vpp-th of its stage's); without one, the micro-batches one after another
    double pipe;
    if (a->pp > 1) {
        double idle[PIPE_MAX_LAYERS], f[PIPE_MAX_LAYERS], b[PIPE_MAX_LAYERS], w[PIPE_MAX_LAYERS], v = a->vpp;
        PipeSchedule sch = a->vpp > 1 ? SCHEDULE_INTERLEAVED : pipe_schedule(a->pp_schedule);
        int zb = sch == SCHEDULE_ZB;
        for (int s = 0; s < a->pp; s++) {
            f[s] = (tf[s] + p2p) / v;
            b[s] = (tb[s] + (zb ? 0 : tw[s]) + p2p) / v;
            w[s] = zb ? tw[s] : 0;
        }
        pipe = pipe_simulate(sch, a->pp, a->vpp, accum, f, b, w, shared ? core : NULL, shared ? share : NULL, idle);
        t.pp = accum * 2 * p2p;
    } else {
        pipe = accum * (tf[0] + tb[0] + tw[0]) * share[0];
    }
    t.bubble = pipe - accum * busy - t.pp > 0 ? pipe - accum * busy - t.pp : 0;
    // dp (the worst stage): what the code overlaps with the backward (as far as the machine's overlap hides it),
    // and what it cannot
    //   ZeRO 0: the all-reduce of each unit starts after its last backward: the last micro-batch's backward
    //   ZeRO 1: so does the reduce-scatter; the all-gather of the updated parameters follows the optimizer
    //   ZeRO 2: a reduce-scatter per micro-batch, each during its backward; then the all-gather
    //   ZeRO 3: the gathers are prefetched during the forward and backward, the reduce-scatters during the
    //           backward, per micro-batch; no all-gather at the end
    double dp_exposed = 0, opt = 0, work = 0;   // work: every rank's busy seconds, summed
    for (int s = 0; s < a->pp; s++) {
        const CommShape *sh = &shapes[s];
        const CommBytes *cb = &stage_bytes[s], *cn = &stage_calls[s];
        double ring = 0, units = 0;   // one reduce-scatter's (or all-gather's) bytes of every unit, dp and edp; the units
        for (int i = 0; i < 2; i++) {
            int p = i == 0 ? sh->dp : sh->edp;
            if (p > 1) { ring += (p - 1.0) / p * X * sh->units[i]; units += sh->nunits[i]; }
        }
        double rs = ring / bw_dp + units * lat_dp, ar = 2 * ring / bw_dp + units * lat_dp, e;   // (a call per unit)
        double bk = (tb[s] + tw[s]) * share[s], z3 = ((cb->dp + cb->edp) / bw_dp + (cn->dp + cn->edp) * lat_dp) / accum;
        if (sh->zero == 0) { e = ar - ov * fmin(ar, bk); }
        else if (sh->zero == 1) { e = rs - ov * fmin(rs, bk) + rs; }
        else if (sh->zero == 2) { e = accum * (rs - ov * fmin(rs, bk)) + rs; }
        else { e = accum * (z3 - ov * fmin(z3, tf[s] * share[s] + bk)); }
        e += cb->emb / bw_emb + cn->emb * lat_emb;   // (the first and the last stage)
        dp_exposed = fmax(dp_exposed, e * share[s]);
        // AdamW over the owned elements: parameter, gradient, m, v (and fp32 master) read and written
        double owned = sh->zero == 0 ? sh->units[0] + sh->units[1] : sh->units[0] / sh->dp + sh->units[1] / sh->edp;
        double o = mc->adamw > 0 ? owned / mc->adamw : owned * (2.0 * X + 8 + 8 + (X == 2 ? 8 : 0)) / mc->mem_bw;
        opt = fmax(opt, o * share[s]);
        work += (double)world / a->pp * (stage_busy[s] + e + o);
    }
    t.dp = dp_exposed;
    t.optimizer = opt;
    // more ranks than cores: while a rank waits (the bubble, a message) another computes on its core, so the
    // step is the longer of the critical path and every rank's work spread over the cores
    t.total = pipe + t.dp + t.optimizer;
    if (slow > 1) {
        double spread = work / mc->cores, k = spread > t.total ? spread / t.total : 1.0;
        t.total *= k;
        t.compute *= k; t.bubble *= k; t.tp *= k; t.cp *= k; t.ep *= k; t.pp *= k; t.dp *= k; t.optimizer *= k;
    }
    return t;
}

// A change of the layout: what (the flags), its kind (one flag: a pair changes two different ones), its
// layout, worst stage's peak, time per step, and whether it fits.
typedef struct { char what[96]; int kind; Args args; double peak; double seconds; int fits; } Lever;
enum { LV_ZERO, LV_SP, LV_TP, LV_PP, LV_SCHEDULE, LV_SPLIT, LV_CP, LV_CE, LV_ATTENTION, LV_RECOMPUTE, LV_BATCH, LV_EP };

// One lever's layout, if it runs: its worst stage's peak and its time.
static int try_lever(Lever *lv, const GPT2Config *c, int world, PlanBuild b, const Machine *mc, double limit,
                     const char *what) {
    char err[512];
    lv->args.dp = -1;   // (world and -d fixed: dp follows)
    if (layout_error(&lv->args, c, world, err, sizeof(err))) { return 0; }
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * lv->args.pp);
    CommShape *shapes = (CommShape *)malloc_check(sizeof(CommShape) * lv->args.pp);
    int w = plan_stages(&lv->args, c, world, b, plans, shapes);
    lv->peak = (double)plans[w].peak_total + plan_reserve(b);
    lv->fits = lv->peak <= limit;
    lv->seconds = plan_step_time(&lv->args, c, world, mc, shapes).total;
    snprintf(lv->what, sizeof(lv->what), "%s", what);
    free(plans);
    free(shapes);
    return 1;
}

static int lever_order(const void *x, const void *y) {
    const Lever *a = (const Lever *)x, *b = (const Lever *)y;
    if (a->fits != b->fits) { return b->fits - a->fits; }
    return a->seconds < b->seconds ? -1 : a->seconds > b->seconds;
}

// The single levers that apply to layout a (world and -d fixed), planned; without one that fits, pairs.
static int plan_levers(const Args *a, const GPT2Config *c, int world, PlanBuild b, const Machine *mc, double limit,
                       Lever *out, int pairs_of) {
    int n = 0;
    #define LEVER(cond, k, what, change) do { \
        if (cond) { \
            Lever lv; lv.args = *a; lv.kind = k; \
            { Args *x = &lv.args; change; } \
            if (try_lever(&lv, c, world, b, mc, limit, what)) { out[n++] = lv; } \
        } } while (0)
    char w[96];
    if (a->zero < 3 && a->dp > 1) {   // (ZeRO shards over dp: nothing to shard at dp 1)
        snprintf(w, sizeof(w), "--zero %d", a->zero + 1);
        LEVER(1, LV_ZERO, w, x->zero = a->zero + 1);
    }
    LEVER(a->tp > 1 && !a->sp, LV_SP, "--sp", x->sp = 1);
    snprintf(w, sizeof(w), "--tp %d --sp", 2 * a->tp); LEVER(1, LV_TP, w, { x->tp = 2 * a->tp; x->sp = 1; });
    // (a split given as counts is for this pp: twice the stages start even)
    int counts = a->pp_layers && strncmp(a->pp_layers, "auto", 4);
    snprintf(w, sizeof(w), "--pp %d%s", 2 * a->pp, counts ? " (even stages)" : "");
    LEVER(1, LV_PP, w, { x->pp = 2 * a->pp; if (counts) { x->pp_layers = NULL; } });
    LEVER(a->pp > 1 && !strcmp(a->pp_schedule, "gpipe"), LV_SCHEDULE, "--pp-schedule 1f1b", x->pp_schedule = "1f1b");
    // ZB-H1: a smaller bubble for the pending W passes' memory (a lever for time: it never lowers the peak)
    LEVER(a->pp > 1 && !strcmp(a->pp_schedule, "1f1b"), LV_SCHEDULE, "--pp-schedule zb", x->pp_schedule = "zb");
    // stages cut by cost: less on the costliest stage (the head's), and the first stage's activations move too
    LEVER(a->pp > 1 && !(a->pp_layers && !strncmp(a->pp_layers, "auto", 4)), LV_SPLIT, "--pp-layers auto",
          x->pp_layers = "auto");
    snprintf(w, sizeof(w), "--cp %d", 2 * a->cp); LEVER(1, LV_CP, w, x->cp = 2 * a->cp);
    LEVER(a->ce_chunk == 0, LV_CE, "--ce-chunk 256", x->ce_chunk = 256);
    if (a->ce_chunk > 64) {
        snprintf(w, sizeof(w), "--ce-chunk %d", a->ce_chunk / 2);
        LEVER(1, LV_CE, w, x->ce_chunk = a->ce_chunk / 2);
    }
    LEVER(b.cuda && a->cp == 1 && strcmp(a->attention, "flash")
          && attention_flash_applies(c->channels / c->num_heads, b.floatx),
          LV_ATTENTION, "--attention flash", x->attention = "flash");
    LEVER(!strcmp(a->recompute, "none"), LV_RECOMPUTE, "--recompute mlp", x->recompute = "mlp");
    LEVER(strcmp(a->recompute, "full"), LV_RECOMPUTE, "--recompute full", x->recompute = "full");
    if (a->B % 2 == 0) {
        snprintf(w, sizeof(w), "-b %d (twice the accumulation)", a->B / 2);
        LEVER(1, LV_BATCH, w, x->B = a->B / 2);
    }
    if (c->num_experts > 0) { snprintf(w, sizeof(w), "--ep %d", 2 * a->ep); LEVER(1, LV_EP, w, x->ep = 2 * a->ep); }
    #undef LEVER
    if (pairs_of) {   // no single lever fits: each pair of two kinds (the second applied on top of the first), once
        int singles = n;
        for (int i = 0; i < singles; i++) {
            Lever more[16];
            int k = plan_levers(&out[i].args, c, world, b, mc, limit, more, 0);
            for (int j = 0; j < k && n < 256; j++) {
                if (more[j].kind <= out[i].kind) { continue; }   // (the same flag twice, or this pair the other way round)
                char both[96];
                snprintf(both, sizeof(both), "%.40s + %.40s", out[i].what, more[j].what);
                memcpy(more[j].what, both, sizeof(both));
                out[n++] = more[j];
            }
        }
        memmove(out, out + singles, (n - singles) * sizeof(Lever));
        n -= singles;
    }
    return n;
}

// The plan's table: a row per stage (and one for a stage's last tp, cp, dp position where it differs), then
// the machine-readable lines "plan STAGE CATEGORY PEAK" that tests read.
static void plan_print_stages(const Args *a, const GPT2Config *c, int world, PlanBuild b, const MemPlan *plans) {
    printf("%-5s", "stage");
    for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11s", mem_category_names[k]); }
    printf(" | %10s  (peak MiB per rank)\n", "peak total");
    for (int s = 0; s < a->pp; s++) {
        printf("%-5d", s);
        for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", plans[s].peak[k] / 1048576.0); }
        printf(" | %10.1f\n", plans[s].peak_total / 1048576.0);
        // the stage's last (tp, cp, dp) position: the same, or a row of its own
        int last = s * a->tp * a->cp + (a->tp - 1) + a->tp * (a->cp - 1) + a->tp * a->cp * a->pp * (a->dp - 1);
        MemPlan other = gpt2_plan(a, c, moe_options(a, c), world, last, b, NULL);
        int same = other.peak_total == plans[s].peak_total;
        for (int k = 0; k < MEM_NCAT; k++) { same &= other.peak[k] == plans[s].peak[k]; }
        if (!same) {
            printf("r%-4d", last);
            for (int k = 0; k < MEM_NCAT; k++) { printf(" | %11.1f", other.peak[k] / 1048576.0); }
            printf(" | %10.1f  (rank %d: the stage's last tp, cp, dp position)\n", other.peak_total / 1048576.0, last);
        }
    }
    for (int s = 0; s < a->pp; s++) {   // machine-readable, for tests: "plan stage category peak"
        for (int k = 0; k < MEM_NCAT; k++) { printf("plan %d %s %zu\n", s, mem_category_names[k], plans[s].peak[k]); }
        printf("plan %d total %zu\n", s, plans[s].peak_total);
    }
}

// Over the limit: the largest category of the worst stage, what dominates it, and the levers (single ones,
// or pairs when none fits) ranked by fit and time, with the machine-readable "lever ..." lines.
static void plan_print_advice(const Args *a, const GPT2Config *c, int world, PlanBuild b, const Machine *mc, double limit,
                              const MemPlan *plans, const CommShape *shapes, int worst) {
    int big = 0;
    for (int k = 1; k < MEM_NCAT; k++) { if (plans[worst].peak[k] > plans[worst].peak[big]) { big = k; } }
    char why[256];
    plan_explain(a, c, world, worst, big, b, plans[worst].slots, why, sizeof(why));
    printf("largest on stage %d: %s = %.2f GiB\n", worst, mem_category_names[big], gib(plans[worst].peak[big]));
    printf("  %s\n", why);
    Lever *levers = (Lever *)malloc_check(sizeof(Lever) * 256);
    Args base = *a;
    int n = plan_levers(&base, c, world, b, mc, limit, levers, 0), any = 0;
    for (int i = 0; i < n; i++) { any |= levers[i].fits; }
    if (!any) { n = plan_levers(&base, c, world, b, mc, limit, levers, 1); }
    qsort(levers, n, sizeof(Lever), lever_order);
    printf("levers (%s; world %d and -d %d fixed, so tp, cp or pp x2 halves dp), fits first, then fastest; the time "
           "per step is the cost model's (%s: %.0f TFLOP/s, %.0f GB/s inside a node of %d, %.0f GB/s across; "
           "the schedule's own bubble): it ranks the levers, it is not this machine's step%s:\n",
           any ? "one at a time" : "no single lever fits: pairs of two", world, a->total_batch, mc->name,
           mc->flops / 1e12, mc->node_bw / 1e9, mc->gpus_per_node, mc->net_bw / 1e9,
           b.cuda || mc->cores > 0 ? "" : " (a CPU rank runs far slower)");
    for (int i = 0; i < n && i < 12; i++) {
        printf("  %-8s %9.3f GiB  %10.2f ms/step  %s\n", levers[i].fits ? "fits" : "too big", gib(levers[i].peak),
               levers[i].seconds * 1e3, levers[i].what);
    }
    for (int i = 0; i < n; i++) {   // machine-readable, for tests: "lever rank fits peak_bytes seconds what"
        printf("lever %d %d %.0f %.6f %s\n", i, levers[i].fits, levers[i].peak, levers[i].seconds, levers[i].what);
    }
    if (n == 0) { printf("  (no lever applies to this layout)\n"); }
    printf("  (this layout: %.2f ms/step)\n", plan_step_time(a, c, world, mc, shapes).total * 1e3);
    free(levers);
}

// Prints the plan of every stage and, with a limit, whether each fits; over the limit, what dominates
// and the levers. Returns 1 if every rank fits (or there is no limit).
static int plan_report(const Args *a, const GPT2Config *c, int world, double limit) {
    PlanBuild b = plan_build(a);
    Machine mc = plan_machine(a);
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * a->pp);
    CommShape *shapes = (CommShape *)malloc_check(sizeof(CommShape) * a->pp);
    int worst = plan_stages(a, c, world, b, plans, shapes), accum = a->total_batch / (a->B * a->T * a->dp);
    double reserve = plan_reserve(b);
    printf("memory plan: L %d C %d NH %d Vp %d%s, world %d = tp %d x cp %d x pp %d x dp %d, B %d T %d x %d "
           "micro-batches, zero %d%s, %s%s, recompute %s, ce chunk %d; %s\n",
           c->num_layers, c->channels, c->num_heads, c->padded_vocab_size, c->num_experts ? " (MoE)" : "", world, a->tp,
           a->cp, a->pp, a->dp, a->B, a->T, accum, a->zero, a->sp ? ", sp" : "", a->pp_schedule,
           a->vpp > 1 ? " (vpp)" : "", a->recompute, a->ce_chunk, b.name);
    plan_print_stages(a, c, world, b, plans);
    StepTime t = plan_step_time(a, c, world, &mc, shapes);
    printf("predicted step: %.3f ms (cost model, %s: compute %.3f, bubble %.3f, exposed tp %.3f cp %.3f ep %.3f pp "
           "%.3f dp %.3f, AdamW %.3f; slowest stage %d)\n", t.total * 1e3, mc.name, t.compute * 1e3, t.bubble * 1e3,
           t.tp * 1e3, t.cp * 1e3, t.ep * 1e3, t.pp * 1e3, t.dp * 1e3, t.optimizer * 1e3, t.stage);
    int fits = 1;
    if (limit > 0) {
        double need = (double)plans[worst].peak_total + reserve;
        fits = need <= limit;
        printf("limit %.2f GiB per rank%s: stage %d needs %.2f GiB: %s\n", gib(limit),
               reserve > 0 ? " (1.00 GiB of it assumed for the CUDA context and NCCL)" : "", worst, gib(need),
                   fits ? "fits" : "does NOT fit");
    }
    if (!fits) { plan_print_advice(a, c, world, b, &mc, limit, plans, shapes, worst); }
    fflush(stdout);
    free(plans);
    free(shapes);
    return fits;
}



// Before allocating: this rank's planned peak against --memory-limit (on CUDA, without one: the free device
// memory, less the reserve the plan assumes for the CUDA context and NCCL). If any rank does not fit, every
// rank stops; rank 0 prints the plan and the levers first.
static void check_memory_fits(const Args *a, const GPT2Config *c, Grid *g) {
    PlanBuild b = plan_build(a);
    double limit = a->memory_limit > 0 ? a->memory_limit : device_free_bytes();
    if (limit <= 0) { return; }
    MemPlan mine = gpt2_plan(a, c, moe_options(a, c), g->world_size, g->rank, b, NULL);
    double need = (double)mine.peak_total + (a->memory_limit > 0 ? plan_reserve(b) : 0.0);
    int over = need > limit ? 1 : 0;
    comm_host_all_reduce(&g->world, &over, 1, DT_INT, HOST_MAX, "all-reduce (memory plan)");
    if (!over) { return; }
    Args shown = *a;
    if (g->rank == 0) { plan_report(&shown, c, g->world_size, limit); }
    fail_all(g->rank,
             "the planned peak of a rank exceeds %s %.2f GiB: see the plan and the levers above (or --plan %d to "
             "explore)",
             a->memory_limit > 0 ? "--memory-limit" : "the free device memory", gib(limit), g->world_size);
}

#endif // LLMC_PLAN_H
