// The cost model: a training step's seconds for any layout, without running it. In one file: the machine (its
// rates: --machine FILE, --calibrate writes one, else an 8 x H200 node), a step's bytes and calls per group by
// formula (comm_step_bytes, comm_step_calls: the same formulas test_gpt asserts equal to what a run counts, in
// every --check-comm layout of the matrix), the pipeline's schedule on a model of time (pipe_simulate: the step
// lists the run executes), and the step's time per stage put together (plan_step_time). plan.h gives it each
// stage's exact shapes (the memory plan runs the model's own set-up); layout_search.h ranks layouts by it.
//
// How good it is (dev/notes/layout_search.md; dev/bench/bench_search.sh): on 2-core CPU machines, 28 layouts at
// 2 ranks and 24 at 4 ranks, each measured against its prediction from a machine file --calibrate wrote in the same
// run: Spearman's rank correlation 0.963 (2 ranks) and 0.913 (4 ranks); a step measured at 1.52x (1.39-1.82) and
// 1.53x (1.41-1.80) its prediction (the CPU runs' fixed costs the model leaves out); the worst misprediction against
// that median ratio 1.20x (2 ranks: -b 1, small micro-batches' per-layer fixed cost undercounted) and 1.18x (4 ranks:
// -b 4 --tp 2 --sp --pp 2). On an H200 (dev/notes/gpu.md), one GPU: GPT-2 124M 44.1 ms predicted, 47.5 measured.
#ifndef LLMC_COST_MODEL_H
#define LLMC_COST_MODEL_H

#include "utils.h"
#include "layout.h"
#include "grid.h"
#include "zero.h"
#include "model_file.h"
#include "pipeline.h"
#include "pipeline_split.h"

// ----------------------------------------------------------------------------
// the machine: each rate is a key of --machine FILE; [calibrated]: --calibrate measures it on this machine with
// this build; [assumed]: a default from public figures (machine_default says which), to be given in the file

#define MACHINE_ROWS 17   // flops_R: R = 1, 2, 4, ... 65536 rows
#define MACHINE_KEYS "flops attn_flops mem_bw node_bw a2a_bw p2p_bw node_lat a2a_lat p2p_lat (each also per group size: node_bw_4) net_bw net_lat layer_cost adamw flash_slower cores overlap gpus_per_node; flops also per GEMM rows: flops_512"

typedef struct {
    double flops;         // [calibrated] FLOP/s per rank on the matrix multiplies (layers, head)
    double flops_at[MACHINE_ROWS];   // [calibrated] flops_R: the same at GEMMs of R = 2^i rows (0: not given; between
                                     // two given, log-linear; outside, the nearest; none given: flops)
    double attn_flops;    // [calibrated] FLOP/s per rank on causal attention's T x T work (6 C T a token)
    double mem_bw;        // [calibrated] bytes/s per rank of the bandwidth-bound kernels (LayerNorm, residual, GELU)
    double node_bw;       // [calibrated] bytes/s per rank a ring collective (all-reduce, reduce-scatter, all-gather)
                          // moves in a node
    double a2a_bw;        // [calibrated] bytes/s per rank an all-to-all sends inside a node (0: node_bw's)
    double p2p_bw;        // [calibrated] bytes/s per rank a send/receive exchange sends inside a node (0: node_bw's)
    double node_lat;      // [calibrated] seconds per call of a ring collective in a node, whatever its size
    double a2a_lat;       // [calibrated] seconds per all-to-all in a node (0: node_lat's)
    double p2p_lat;       // [calibrated] seconds per message of a send/receive exchange in a node (0: node_lat's)
    double at[6][8];      // [calibrated] the six per group size 2^i (node_bw_P, a2a_bw_P, p2p_bw_P, node_lat_P,
                          // a2a_lat_P, p2p_lat_P; 0: the size-less key's)
    double net_bw;        // [assumed] bytes/s per rank a collective moves across nodes
    double net_lat;       // [assumed] seconds per call of a collective across nodes
    double layer_cost;    // [calibrated] seconds per layer and micro-batch, forward and backward, beyond its work
                          // (its kernels' launches)
    double adamw;         // [calibrated] parameters per second of the optimizer, the clip norm's pass included (0:
                          // its bytes at mem_bw: parameter, gradient, m, v and the bf16 build's fp32 master)
    double flash_slower;  // [calibrated on CUDA] --attention flash: its attention time over cuBLAS's (attn_flops)
    double cores;         // [calibrated] CPU ranks: the cores the ranks share (0: a device per rank)
    double overlap;       // [calibrated] the share of a collective posted beside compute that the compute hides
                          // (1: NCCL on its own stream; CPU ranks: MPI progresses on the rank's own core)
    double elem_passes;   // [assumed] (B T, C) tensors a layer's bandwidth-bound kernels read and write, forward and
                          // backward (LayerNorms, residuals, GELU, softmax), at mem_bw
    int gpus_per_node;    // [assumed] ranks per node (groups within it use node_bw)
    char given[1024];     // the keys a machine file set (the others: the defaults)
    const char *name;
} Machine;

// The default: an 8-GPU H200 node (NVLink) on an InfiniBand network, each figure's source beside it.
static Machine machine_default(void) {
    Machine m;
    memset(&m, 0, sizeof(m));
    m.flops = 200e12;       // about 20% of the H200's dense bf16 peak (989 TFLOP/s): this program's GPU check on 124M
    m.attn_flops = 100e12;  // half that
    m.mem_bw = 3.0e12;      // about 2/3 of the H200's 4.8 TB/s HBM3e
    m.node_bw = 300e9;      // NCCL's all-reduce bus bandwidth on an H100/H200 NVLink node, 360-480 GB/s in nccl-tests
                            // (NVLink 4: 450 GB/s each way); a2a_bw, p2p_bw: the same (NVSwitch: every pair at full
                            // NVLink bandwidth)
    m.node_lat = 10e-6;     // a small all-reduce on an H100 node: about 6-10 us in nccl-tests (NVIDIA/nccl 583, 1259)
    m.p2p_lat = 5e-6;       // a small send/receive about 4 us (NVIDIA/nccl 1984); a2a_lat: node_lat's
    m.net_bw = 40e9;        // one 400 Gb/s ConnectX-7 port per GPU (50 GB/s)
    m.net_lat = 25e-6;      // a few us of InfiniBand per hop on top
    m.layer_cost = 50e-6;   // the launches of a layer's ~20 kernels at a few us each
    m.flash_slower = 0.41;  // the flash kernels' time over cuBLAS's on an H200, GPT-2 124M B16 T1024 (1.05 / 2.58 ms, dev/notes/gpu.md)
    m.overlap = 1.0;        // NCCL runs on its own stream: a collective posted before compute runs beside it
    m.elem_passes = 40.0;   // counted by hand from the layer's kernels
    m.gpus_per_node = 8;
    m.name = "an 8 x H200 node, InfiniBand between nodes (defaults)";
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

// The machine file's keys: each a field (the per-size ones: its size's slot), and the range of its values.
typedef struct { const char *key; double *field; double lo, hi; } MachineKey;

// key -> its field and range (the key's size or rows in *size_err's message when they are not a power of two).
// Returns 0 for an unknown key.
static int machine_key(Machine *m, const char *key, MachineKey *k, char *why, size_t n) {
    static const char *named[] = {"flops", "attn_flops", "mem_bw", "node_bw", "a2a_bw", "p2p_bw", "node_lat", "a2a_lat",
                                  "p2p_lat", "net_bw", "net_lat", "layer_cost", "adamw", "flash_slower", "cores",
                                  "overlap", "gpus_per_node"};
    double *fields[] = {&m->flops, &m->attn_flops, &m->mem_bw, &m->node_bw, &m->a2a_bw, &m->p2p_bw, &m->node_lat,
                        &m->a2a_lat, &m->p2p_lat, &m->net_bw, &m->net_lat, &m->layer_cost, &m->adamw,
                        &m->flash_slower, &m->cores, &m->overlap, NULL};
    // rates at least 1 (per second), latencies and costs 0 to 1000 s, shares 0 to 1, counts 0 to 2^20
    static const double lo[] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0.01, 0, 0, 1},
        hi[] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e3, 1e3, 1e3, 1e30, 1e3, 1e3, 1e30, 100, 1 << 20, 1, 1 << 20};
    for (int i = 0; i < (int)(sizeof(named) / sizeof(named[0])); i++) {
        if (!strcmp(key, named[i])) { *k = (MachineKey){named[i], fields[i], lo[i], hi[i]}; return 1; }
    }
    why[0] = '\0';
    char *end;
    if (!strncmp(key, "flops_", 6)) {   // (per GEMM rows: flops_512)
        long r = strtol(key + 6, &end, 10);
        int i = 0;
        while (i < MACHINE_ROWS - 1 && (1L << i) < r) { i++; }
        if (*end || r != 1L << i) {
            snprintf(why, n, "'%s': the rows after flops_ must be 1, 2, 4, ... or %ld", key, 1L << (MACHINE_ROWS - 1));
            return 0;
        }
        *k = (MachineKey){key, &m->flops_at[i], 1, 1e30};
        return 1;
    }
    static const char *kinds[6] = {"node_bw_", "a2a_bw_", "p2p_bw_", "node_lat_", "a2a_lat_", "p2p_lat_"};
    for (int j = 0; j < 6; j++) {   // (per group size: node_bw_4; a latency per size > 0: 0 is "not given")
        size_t kl = strlen(kinds[j]);
        if (strncmp(key, kinds[j], kl)) { continue; }
        long p = strtol(key + kl, &end, 10);
        int i = 1;
        while (i < 7 && (1L << i) < p) { i++; }
        if (*end || p != 1L << i) {
            snprintf(why, n, "'%s': the group size after %s must be 2, 4, ... or 128", key, kinds[j]);
            return 0;
        }
        *k = (MachineKey){key, &m->at[j][i], j < 3 ? 1 : 1e-12, j < 3 ? 1e30 : 1e3};
        return 1;
    }
    snprintf(why, n, "unknown key '%s' (known: %s)", key, MACHINE_KEYS);
    return 0;
}

// One line "key = value" (# comments, blank lines) into m; returns 1 with the reason in why.
static int machine_line(Machine *m, char *line, char *why, size_t n) {
    char *h = strchr(line, '#');
    if (h) { *h = '\0'; }
    line[strcspn(line, "\r\n")] = '\0';
    char key[64], val[64], rest[8];
    int got = sscanf(line, " %63[^= \t] = %63s %7s", key, val, rest);
    if (got <= 0) { return 0; }   // (blank)
    if (got != 2) { snprintf(why, n, "expected key=value (a number), got '%.60s'", line); return 1; }
    char *end;
    double v = strtod(val, &end);
    if (*end || !isfinite(v)) { snprintf(why, n, "%s = '%s' is not a finite number", key, val); return 1; }
    MachineKey k;
    if (!machine_key(m, key, &k, why, n)) { return 1; }
    if (!(v >= k.lo && v <= k.hi)) { snprintf(why, n, "%s = %g must be in [%g, %g]", key, v, k.lo, k.hi); return 1; }
    if (!k.field && v != (int)v) { snprintf(why, n, "%s = %g must be a whole number", key, v); return 1; }
    if (k.field) { *k.field = v; } else { m->gpus_per_node = (int)v; }
    size_t o = strlen(m->given);
    snprintf(m->given + o, sizeof(m->given) - o, "%s%s", o ? " " : "", key);
    return 0;
}

// --machine FILE: key=value lines; unknown keys and values that are not whole finite numbers in the key's range
// are errors naming the file, the line and the key.
static int machine_read(Machine *m, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "--machine %s: cannot open it", path); return 1; }
    char line[256], why[384];
    for (int n = 1; fgets(line, sizeof(line), f); n++) {
        if (machine_line(m, line, why, sizeof(why))) {
            snprintf(err, errlen, "--machine %s line %d: %s", path, n, why);
            fclose(f);
            return 1;
        }
    }
    fclose(f);
    m->name = path;
    return 0;
}

// The machine of --machine FILE (each key it lacks: the default's), with --gpus-per-node over its own.
static Machine plan_machine(const char *path, int gpus_per_node) {
    Machine m = machine_default();
    char err[512];
    if (path && machine_read(&m, path, err, sizeof(err))) { fail("%s", err); }
    if (gpus_per_node > 0) { m.gpus_per_node = gpus_per_node; }
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

// ----------------------------------------------------------------------------
// a step's bytes and calls per group, by formula: the ring algorithms' counts (comm.h counts each collective as
// the bytes one rank sends: all-reduce 2(p-1)/p n, reduce-scatter and all-gather (p-1)/p n, point-to-point and
// all-to-all what leaves the rank). test_gpt asserts both equal to what a run counted. Their inputs, CommShape, are
// the rank's shapes as the model set them up (the model's, from a run or from a plan).

typedef struct {
    double X;                           // bytes per element (floatX)
    int tp, cp, pp, sp, vpp, first, last;   // the grid; this rank's stage: first / last, model chunks
    int zero, dp, edp, ep;              // ZeRO stage; the sizes of the gradients' group (dp, or dp x cp), the
                                        // experts' (edp) and ep
    int B, BT, BTs, C, Cl, Ckv, Ls;     // BT = B*T/cp tokens of the rank, BTs its LayerNorm/residual slice (SP:
                                        // BT/tp), Cl = C/tp, Ckv its kv heads' channels (KV hs/tp; GPT-2: Cl), Ls the
                                        // stage's layers
    int cp_u, Ckv_cp;                   // cp's all-to-all group size U (1: the ring alone); the kv channels a rank's
                                        // tokens carry over cp (U Hkv hs: Ckv, more with replicated kv heads)
    int ce_chunk, recompute_full, qknorm;   // qknorm: QK-norm (OLMoE), its sums all-reduced over tp per layer
    int nmoe, moe_layers, topk, E, El, capped, padded, cap, bias, sgate;   // MoE: the stage's MoE layers, the model's;
                                        // capped: a capacity below T (cp shares the sequences' assignments);
                                        // padded dispatch (cap rows per slot); loss-free balancing on;
                                        // the shared experts' gate (Qwen2-MoE)
    // ZeRO: padded elements of the units (zero.h), by group: [0] reduced over dp, [1] over edp (the experts)
    double units[2], rep;               // rep: replicated over tp, partial sums under SP (LayerNorms, biases)
    double embed_padded, embed_shard;   // the tied embedding's unit with a pipeline (0: none on this stage)
    // ZeRO-3's gathers, ring elements per group [2] ((p-1)/p x padded): once per step, per micro-batch, and
    // saved between two micro-batches (units still gathered); exact = 1 where the policy's count is exact (no
    // pipeline, no MoE: zero_unit_params), else an upper bound (every use of a unit gathered)
    double z3_step[2], z3_micro[2], z3_between[2];
    int z3_exact;
    // the calls: units per group [2], units with replicated elements (SP's all-reduce over tp), and ZeRO-3's
    // gathers per group as the ring elements above count them (once per step, per micro-batch, saved between)
    int nunits[2], nrep_units;
    double z3n_step[2], z3n_micro[2], z3n_between[2];
    int world;                          // the world's size
    double muon_out;                    // Muon: its elements this rank sends to other ranks per step, both ways
    int muon_calls;                     // Muon is on (its two all-to-alls are calls even when nothing leaves)
} CommShape;

// CommShape's ZeRO part from the stage's units (zero.h): padded elements and calls per group, ZeRO-3's gathers
// (exact where zero_unit_params' policy is simple to count: no pipeline, no MoE, a tied head; else the bound), and
// the tied embedding's unit with a pipeline
static void comm_shape_units(CommShape *s, const ModelConfig *c, const Grid *grid, const Unit *units, int nunits,
                             int u_embed, int u_final, const int *u_layer) {
    int exact = grid->pp == 1 && s->nmoe == 0 && c->num_layers >= 2 && c->tied;   // zero_unit_params' policy
    s->z3_exact = exact;
    for (int u = 0; u < nunits; u++) {
        const Unit *U = &units[u];
        int i = U->dpg == &grid->edp_group;
        double r = (U->dpg->size - 1.0) / U->dpg->size * U->padded;   // ring elements of one gather
        s->units[i] += U->padded;
        s->nunits[i]++;
        s->rep += U->nrep;
        s->nrep_units += U->nrep > 0;
        if (exact) { continue; }
        // (the bound: see CommShape; an untied head shares the embedding's work buffer with wte, each evicting the other)
        if (U->embedding && c->tied) { s->z3_step[i] += r; s->z3n_step[i]++; }
        else { s->z3_micro[i] += 2 * r; s->z3n_micro[i] += 2; }
    }
    if (exact) {
        // the embedding gathered once per step; each layer twice per micro-batch (forward, backward) but the
        // last, still there for its backward; the final LayerNorm once per micro-batch; layers 0 and 1 kept
        // from one micro-batch's backward to the next one's forward
        int L = c->num_layers;
        double r = (grid->grad_group->size - 1.0) / grid->grad_group->size, E = units[u_embed].padded;
        double F = units[u_final].padded, Llast = units[u_layer[L - 1]].padded;
        s->z3_step[0] = r * E;
        s->z3_micro[0] = r * (2.0 * (s->units[0] - E - F) + F - Llast);
        s->z3_between[0] = r * (units[u_layer[0]].padded + units[u_layer[1]].padded);
        s->z3n_step[0] = 1;
        s->z3n_micro[0] = 2 * L;   // (2 per layer and the final LayerNorm's 1, less the last layer's)
        s->z3n_between[0] = 2;
    }
    if (grid->pp > 1 && u_embed >= 0 && c->tied) {   // the tied embedding's copy on the last stage
        s->embed_padded = units[u_embed].padded;
        s->embed_shard = units[u_embed].shard;
    }
}

// bytes per step, one rank's; world: the step's loss and norm, and Muon's all-to-alls (muon.h)
typedef struct { double tp, cp, pp, dp, edp, ep, emb, world; } CommBytes;

// cp's attention per layer and micro-batch (context_parallel.h), one rank's bytes and calls: the ring's hops (ring)
// and the all-to-alls (a2a). The ring over N' = N/U positions: N'-1 hops of k, v forward (again when recomputed),
// N'-1 of k, v and N' of dk, dv backward, each (B, U T/cp, 2 Hkv hs) = BT 2 Ckv_cp (the kv heads, fewer than the
// queries' with GQA). U > 1, (U-1)/U of each all-to-all's blocks leave the rank: forward q, k, v (BT (Cl + 2
// Ckv_cp)) and the output (BT Cl) back (again when recomputed); backward the output again, dout (BT Cl each) and
// dq, dk, dv (BT (Cl + 2 Ckv_cp)) back.
typedef struct { double ring, ring_calls, a2a, a2a_calls; } CPAttnComm;
static CPAttnComm cp_attention_comm(const CommShape *s) {
    CPAttnComm c = {0, 0, 0, 0};
    if (s->cp == 1) { return c; }
    int U = s->cp_u > 1 ? s->cp_u : 1, N = s->cp / U, fwd = s->recompute_full ? 2 : 1;
    if (N > 1) {
        c.ring_calls = fwd * (N - 1) + (N - 1) + N;
        c.ring = c.ring_calls * s->X * s->BT * 2.0 * s->Ckv_cp;
    }
    if (U > 1) {
        double r = (U - 1.0) / U, qkv = s->BT * ((double)s->Cl + 2.0 * s->Ckv_cp), o = (double)s->BT * s->Cl;
        c.a2a = r * s->X * (fwd * (qkv + o) + (2 * o + qkv));
        c.a2a_calls = 2 * fwd + 3;
    }
    return c;
}

// The rows the MoE all-to-alls move per step when the routing spreads the assignments evenly over the
// experts (padded dispatch: exactly, whatever the routing): to and from the other ep ranks, every MoE
// layer and micro-batch, counted once each way (forward dispatch + return is 2x; comm_step_bytes adds the
// backward and the recomputation).
static double comm_ep_rows_even(const CommShape *s, int accum) {
    if (s->ep == 1 || s->nmoe == 0) { return 0; }
    if (s->padded) { return (double)s->nmoe * accum * 2.0 * (s->ep - 1) * s->El * s->B * s->cap; }
    return (double)s->nmoe * accum * 2.0 * s->BT * s->topk * (s->ep - 1.0) / s->ep;
}

// tp's bytes of a step (comm_step_bytes')
static double comm_tp_bytes(const CommShape *s, int accum) {
    double X = s->X;
    // tp, per micro-batch: 4 collectives per layer of the stage, plus the embedding (first stage) and the head
    // (last stage): SP (ends+4L) reduce-scatters + (ends+6L) all-gathers of (p-1)/p BT C (2L of them the
    // backward's re-gathers), without SP (ends+4L) all-reduces; recompute full: each layer's forward
    // collectives again; the CE chunks' statistics (3 floats a token over the tp ranks); MoE: the gates'
    // gradient (BT, k) fp32 all-reduced per MoE layer (and the shared gate's logits', BT); QK-norm: per layer q's
    // and k's sums (2 BT fp32) all-reduced forward, backward (and recomputed); a pipeline without SP: the stage boundary tensors, of
    // which each tp rank received 1/tp, all-gathered; SP: the replicated elements' partial-sum gradients
    // all-reduced once per step (ZeRO-2/3: per micro-batch)
    if (s->tp == 1) { return 0; }
    double S = X * s->BT * s->C, ring = (s->tp - 1.0) / s->tp, ends = s->first + s->last;
    double act = (2 * ends + (s->sp ? 10.0 : 8.0) * s->Ls) * ring * S;
    if (s->recompute_full) { act += 4.0 * s->Ls * ring * S; }
    double ce = 0;
    for (int c0 = 0; s->last && c0 < s->BT; c0 += s->ce_chunk) {
        int n = s->BT - c0 < s->ce_chunk ? s->BT - c0 : s->ce_chunk;
        ce += (s->tp - 1.0) * 3 * n * 4;
    }
    double pipe_ag = s->pp > 1 && !s->sp
            ? ((s->vpp - s->first) + (s->vpp - s->last)) * ring * S * s->BTs / s->BT : 0;
    double gates = s->nmoe * 2.0 * ring * s->BT * (s->topk + (s->sgate ? 1 : 0)) * 4;   // (+ the shared gate's)
    double rep = s->sp ? 2.0 * ring * X * s->rep * (s->zero >= 2 ? accum : 1) : 0;
    double qkn = s->qknorm ? s->Ls * (s->recompute_full ? 3.0 : 2.0) * 2.0 * ring * 2.0 * s->BT * 4 : 0;
    return accum * (act + ce + pipe_ag + gates + qkn) + rep;
}

// One step of `accum` micro-batches. ep_rows: the rows the all-to-alls moved (a run counts them from its
// routing; a plan: comm_ep_rows_even). gathered[2]: ZeRO-3's ring elements gathered per group, as a run
// counted them (NULL: from the shape's policy: exact or the bound, see CommShape).
static CommBytes comm_step_bytes(const CommShape *s, int accum, double ep_rows, const double *gathered) {
    CommBytes b = {0, 0, 0, 0, 0, 0, 0, 0};
    double X = s->X;
    // dp and edp: ZeRO's reductions and gathers, per group
    int p[2] = {s->dp, s->edp};
    double balance = s->bias ? 2.0 * (s->dp - 1) / s->dp * 4.0 * s->moe_layers * s->E : 0;   // the loads (ints)
    double *out[2] = {&b.dp, &b.edp};
    for (int i = 0; i < 2; i++) {
        if (p[i] == 1 || s->units[i] == 0) { continue; }
        double ring = (p[i] - 1.0) / p[i] * X * s->units[i];   // one reduce-scatter, or one all-gather
        if (s->zero < 2) { *out[i] = 2.0 * ring; }                  // all-reduce (0), or RS + AG of the params (1)
        else if (s->zero == 2) { *out[i] = ring * (accum + 1); }    // RS per micro-batch + AG of the params
        else {                                                      // gathers + RS per micro-batch
            double g = gathered ? gathered[i]
                    : s->z3_step[i] + accum * s->z3_micro[i] - (accum - 1.0) * s->z3_between[i];
            *out[i] = X * g + accum * ring;
        }
    }
    b.dp += balance;   // loss-free balancing: the step's loads (MoE layers, E) ints all-reduced
    // emb: the tied embedding's gradient summed over the two end stages (an all-reduce over 2 ranks: n)
    if (s->pp > 1 && s->embed_padded > 0) { b.emb = X * (s->zero == 0 ? s->embed_padded : s->embed_shard); }
    // pp: each micro-batch and model chunk, the output activation forward (but the last stage's last chunk) and
    // the input gradient back (but the first stage's chunk 0); without SP each tp rank sends 1/tp of it
    if (s->pp > 1) {
        double slice = (double)s->BTs * s->C / (!s->sp && s->tp > 1 ? s->tp : 1);
        b.pp = accum * X * slice * ((s->vpp - s->last) + (s->vpp - s->first));
    }
    // cp: the attention's, per layer and micro-batch (cp_attention_comm: the ring's hops, Ulysses' all-to-alls);
    // MoE, per layer and forward (again when recomputed): the sequences' other assignments for the capacity
    // all-gathered ((B, T/cp, k) ints and floats; not when dropless), and f all-reduced ((B, E) floats)
    if (s->cp > 1) {
        int N = s->cp, fwd = s->recompute_full ? 2 : 1;
        CPAttnComm a = cp_attention_comm(s);
        double moe = s->nmoe * fwd * ((s->capped ? 2.0 * (N - 1) * s->BT * s->topk * 4 : 0)
                                      + 2.0 * (N - 1) / N * s->B * s->E * 4);
        b.cp = (double)accum * (s->Ls * (a.ring + a.a2a) + moe);
    }
    // ep: the rows x C each way, forward (dispatch, return), backward (the same), and the recomputed forward
    if (s->ep > 1 && s->nmoe > 0) { b.ep = (s->recompute_full ? 3 : 2) * ep_rows * s->C * X; }
    b.tp = comm_tp_bytes(s, accum);   // tp: the layers' collectives, the CE's statistics, MoE's gates
    // world: the step's loss sum and squared norm (2 doubles) all-reduced; Muon: U to the matrices' owners and their
    // results back, fp32, the elements whose other end is another rank
    if (s->world > 1) { b.world = 2.0 * (s->world - 1) / s->world * 16 + 4.0 * s->muon_out; }
    return b;
}

// The calls one rank makes in a training step, per group: the collectives comm_step_bytes counts the bytes of,
// each counted once (a point-to-point exchange: each message sent), as comm.h counts Group.calls. What a
// collective's latency costs (plan_step_time) is per call, whatever its size. gathered[2]: ZeRO-3's gathers per group as
// a run counted them (NULL: from the shape's policy, as comm_step_bytes).
static CommBytes comm_step_calls(const CommShape *s, int accum, const double *gathered) {
    CommBytes n = {0, 0, 0, 0, 0, 0, 0, 0};
    // dp and edp: per unit, an all-reduce (ZeRO 0), a reduce-scatter and an all-gather (1), a reduce-scatter per
    // micro-batch and an all-gather (2), the gathers and a reduce-scatter per micro-batch (3)
    int p[2] = {s->dp, s->edp};
    double *out[2] = {&n.dp, &n.edp};
    for (int i = 0; i < 2; i++) {
        if (p[i] == 1 || s->units[i] == 0) { continue; }
        double u = s->nunits[i];
        if (s->zero == 0) { *out[i] = u; }
        else if (s->zero == 1) { *out[i] = 2 * u; }
        else if (s->zero == 2) { *out[i] = u * (accum + 1); }
        else {
            double g = gathered ? gathered[i] : s->z3n_step[i] + accum * s->z3n_micro[i] - (accum - 1.0) * s->z3n_between[i];
            *out[i] = g + accum * u;
        }
    }
    if (s->bias && s->dp > 1) { n.dp += 1; }   // loss-free balancing's loads
    if (s->pp > 1 && s->embed_padded > 0) { n.emb = 1; }
    if (s->pp > 1) { n.pp = accum * ((s->vpp - s->last) + (s->vpp - s->first)); }
    // cp: a message per hop, a call per all-to-all; MoE: the capacity's two all-gathers (capped) and f's all-reduce,
    // per forward
    if (s->cp > 1) {
        int fwd = s->recompute_full ? 2 : 1;
        CPAttnComm a = cp_attention_comm(s);
        n.cp = (double)accum * (s->Ls * (a.ring_calls + a.a2a_calls) + s->nmoe * fwd * ((s->capped ? 2 : 0) + 1));
    }
    // ep: dispatch and return, forward, backward (and the recomputed forward)
    if (s->ep > 1 && s->nmoe > 0) { n.ep = (double)accum * s->nmoe * 2 * (s->recompute_full ? 3 : 2); }
    // tp, per micro-batch: SP 2 per end and 10 per layer (recompute full: 4 more), without SP 1 per end and 4 per
    // layer (2 more); a CE chunk's statistics; MoE's gates; the stage boundaries' gathers (a pipeline without SP);
    // SP's replicated gradients, per unit that has some, once per step (ZeRO-2/3: per micro-batch)
    if (s->tp > 1) {
        double ends = s->first + s->last, act;
        if (s->sp) { act = 2 * ends + 10.0 * s->Ls + (s->recompute_full ? 4.0 * s->Ls : 0); }
        else { act = ends + 4.0 * s->Ls + (s->recompute_full ? 2.0 * s->Ls : 0); }
        double ce = s->last ? (s->BT + s->ce_chunk - 1) / s->ce_chunk : 0;
        double pipe_ag = s->pp > 1 && !s->sp ? (s->vpp - s->first) + (s->vpp - s->last) : 0;
        double rep = s->sp ? (double)s->nrep_units * (s->zero >= 2 ? accum : 1) : 0;
        double qkn = s->qknorm ? s->Ls * (s->recompute_full ? 3.0 : 2.0) : 0;
        n.tp = accum * (act + ce + pipe_ag + s->nmoe * (s->sgate ? 2 : 1) + qkn) + rep;
    }
    if (s->world > 1) { n.world = 1 + (s->muon_calls ? 2 : 0); }   // the stats; Muon's two all-to-alls
    return n;
}


// ----------------------------------------------------------------------------
// the pipeline's schedule on a model of time

// A step's pass on rank r in the model of time: its forward tf[r] and its backward tb[r] + tw[r] (ZB: tb[r]; its
// W is a pass of its own).
static double pipe_pass_seconds(PipeSchedule schedule, const PipeStep *st, int r, const double *tf, const double *tb,
                                const double *tw) {
    return (st->fwd >= 0 ? tf[r] : 0) + (st->bwd >= 0 ? tb[r] + (schedule == SCHEDULE_ZB ? 0 : tw[r]) : 0);
}

// The i-th receive rank r posts from a peer is the peer's i-th send to r: the index of msg[j]'s message among
// those from its peer (nrecv: those r has received so far, [from][to] of pp).
static int pipe_recv_index(const PipeMsg *msg, int j, const int *nrecv, int pp, int r) {
    int p = msg[j].peer, i = nrecv[p * pp + r];
    for (int e = 0; e < j; e++) { i += !msg[e].send && msg[e].peer == p; }
    return i;
}

// The schedule on a model of time: every rank runs its list, on rank r a forward (of one chunk) takes tf[r], a
// backward tb[r] + tw[r] (ZB: its B tb[r], its W tw[r]), a message arrives when it is posted, a step waits for
// its receives after its W (as pipe_exchange does). Returns the step's length (the last rank's end); idle[r]
// (pp of them): rank r's time not computing, the bubble. What the bubble of a schedule is, from the list the
// run executes, with each stage's own times (the last stage's LM head, an uneven split).
// pipe_walk: each rank on a processor of its own, so each walks its list as far as its receives have been sent.
static double pipe_walk(PipeSchedule schedule, int pp, int vpp, int m, const double *tf, const double *tb,
                        const double *tw, double *idle) {
    StepList *l = (StepList *)malloc_check(pp * sizeof(StepList));
    int *pos = (int *)calloc_check(pp, sizeof(int)), *posted = (int *)calloc_check(pp, sizeof(int));
    int *nsent = (int *)calloc_check((size_t)pp * pp, sizeof(int)), *nrecv = (int *)calloc_check((size_t)pp * pp, sizeof(int));
    double *t = (double *)calloc_check(pp, sizeof(double)), *busy = (double *)calloc_check(pp, sizeof(double));
    int cap = 4 * m * vpp + 8;   // messages from one rank to another in a step: at most 2 per micro-batch and chunk
    double *sent = (double *)malloc_check((size_t)pp * pp * cap * sizeof(double));   // [from][to][i]: i-th's post time
    for (int r = 0; r < pp; r++) { l[r] = pipeline_steps(schedule, pp, vpp, r, m, 0); }
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < pp; r++) {
            while (pos[r] < l[r].n) {
                const PipeStep *st = &l[r].s[pos[r]];
                PipeMsg msg[4];
                int n = pipe_step_messages(st, pp, r, msg), ready = 1;
                if (!posted[r]) {   // compute, post the sends, run the W
                    double c = pipe_pass_seconds(schedule, st, r, tf, tb, tw);
                    t[r] += c;
                    busy[r] += c;
                    for (int j = 0; j < n; j++) {
                        if (msg[j].send) { sent[((size_t)r * pp + msg[j].peer) * cap + nsent[r * pp + msg[j].peer]++] = t[r]; }
                    }
                    if (st->wgt >= 0) { t[r] += tw[r]; busy[r] += tw[r]; }
                    posted[r] = 1;
                }
                double arrive = t[r];
                for (int j = 0; j < n; j++) {   // the i-th receive from a peer is the peer's i-th send to this rank
                    if (msg[j].send) { continue; }
                    int p = msg[j].peer, i = pipe_recv_index(msg, j, nrecv, pp, r);
                    if (i >= nsent[p * pp + r]) { ready = 0; break; }
                    double a = sent[((size_t)p * pp + r) * cap + i];
                    if (a > arrive) { arrive = a; }
                }
                if (!ready) { break; }
                for (int j = 0; j < n; j++) { if (!msg[j].send) { nrecv[msg[j].peer * pp + r]++; } }
                t[r] = arrive;
                posted[r] = 0;
                pos[r]++;
                moved = 1;
            }
        }
    }
    double end = 0;
    for (int r = 0; r < pp; r++) {
        if (pos[r] < l[r].n) { fail("pipe_walk: rank %d stuck at step %d of %d: a bug", r, pos[r], l[r].n); }
        if (t[r] > end) { end = t[r]; }
    }
    for (int r = 0; r < pp; r++) { idle[r] = end - busy[r]; free(l[r].s); }
    free(l); free(pos); free(posted); free(nsent); free(nrecv); free(t); free(busy); free(sent);
    return end;
}

// pipe_shared: the same where ranks share a processor (CPU ranks, more than the cores): core[r] is rank r's, and
// weight[r] how many ranks compute as it does there (itself and the other pipelines' copies of its stage); while
// ranks compute, each of a core's gets 1 / (the weights of the core's computing ranks, at least 1) of it. An
// event simulation: time advances to the next end of a pass.
enum { SIM_START, SIM_MAIN, SIM_WGT, SIM_WAIT, SIM_DONE };   // a rank: starting a step, in its pass, in its W, ...
typedef struct {
    PipeSchedule schedule;
    int pp;
    const double *tf, *tb, *tw;
    StepList *l;
    int *pos, *state;        // (pp) each rank's step, its state
    int *nsent, *nrecv;      // (pp, pp) [from][to] messages sent, received
    double *rem, *busy;      // (pp) seconds left of the pass running, seconds computed
    double *end_at, now;     // (pp) when each rank finished its list; the clock
} SharedSim;

// What happens at this instant: passes start, sends are posted, receives complete, until nothing changes.
static void shared_events(SharedSim *s) {
    int pp = s->pp;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < pp; r++) {
            if (s->state[r] == SIM_START) {
                changed = 1;
                if (s->pos[r] == s->l[r].n) { s->state[r] = SIM_DONE; s->end_at[r] = s->now; continue; }
                s->rem[r] = pipe_pass_seconds(s->schedule, &s->l[r].s[s->pos[r]], r, s->tf, s->tb, s->tw);
                s->state[r] = SIM_MAIN;
            }
            const PipeStep *st = &s->l[r].s[s->pos[r] < s->l[r].n ? s->pos[r] : 0];
            PipeMsg msg[4];
            int n = s->state[r] == SIM_DONE ? 0 : pipe_step_messages(st, pp, r, msg);
            if (s->state[r] == SIM_MAIN && s->rem[r] <= 0) {   // the pass done: post the sends, run the W
                for (int j = 0; j < n; j++) { if (msg[j].send) { s->nsent[r * pp + msg[j].peer]++; } }
                s->rem[r] = st->wgt >= 0 ? s->tw[r] : 0;
                s->state[r] = SIM_WGT;
                changed = 1;
            }
            if (s->state[r] == SIM_WGT && s->rem[r] <= 0) { s->state[r] = SIM_WAIT; changed = 1; }
            if (s->state[r] == SIM_WAIT) {   // its receives: each sent already
                int ready = 1;
                for (int j = 0; j < n && ready; j++) {
                    if (!msg[j].send) { ready = pipe_recv_index(msg, j, s->nrecv, pp, r) < s->nsent[msg[j].peer * pp + r]; }
                }
                if (!ready) { continue; }
                for (int j = 0; j < n; j++) { if (!msg[j].send) { s->nrecv[msg[j].peer * pp + r]++; } }
                s->pos[r]++;
                s->state[r] = SIM_START;
                changed = 1;
            }
        }
    }
}

// The ranks computing, each at its share of its core, to the next end of a pass. Returns 0 when every rank is done.
static int shared_advance(SharedSim *s, const int *core, const double *weight, double *load, double *rate) {
    int pp = s->pp, active = 0, done = 0;
    for (int k = 0; k < pp; k++) { load[k] = 0; }
    for (int r = 0; r < pp; r++) {
        done += s->state[r] == SIM_DONE;
        if (s->state[r] == SIM_MAIN || s->state[r] == SIM_WGT) { active++; load[core[r]] += weight[r]; }
    }
    if (done == pp) { return 0; }
    for (int r = 0; r < pp && !active; r++) {
        if (s->state[r] != SIM_DONE) { fail("pipe_shared: rank %d stuck at step %d of %d: a bug", r, s->pos[r], s->l[r].n); }
    }
    double dt = 0;
    int first = 1;
    for (int r = 0; r < pp; r++) {
        if (s->state[r] != SIM_MAIN && s->state[r] != SIM_WGT) { continue; }
        double w = load[core[r]];
        rate[r] = w > 1 ? 1 / w : 1;
        if (first || s->rem[r] / rate[r] < dt) { dt = s->rem[r] / rate[r]; first = 0; }
    }
    s->now += dt;
    for (int r = 0; r < pp; r++) {
        if (s->state[r] != SIM_MAIN && s->state[r] != SIM_WGT) { continue; }
        double left = s->rem[r] - rate[r] * dt;
        s->busy[r] += s->rem[r] - (left > 0 ? left : 0);
        s->rem[r] = s->rem[r] / rate[r] <= dt * (1 + 1e-12) ? 0 : left;   // (ends within rounding: ends now)
    }
    return 1;
}

static double pipe_shared(PipeSchedule schedule, int pp, int vpp, int m, const double *tf, const double *tb,
                          const double *tw, const int *core, const double *weight, double *idle) {
    SharedSim s = {schedule, pp, tf, tb, tw, (StepList *)malloc_check(pp * sizeof(StepList)),
                   (int *)calloc_check(pp, sizeof(int)), (int *)calloc_check(pp, sizeof(int)),
                   (int *)calloc_check((size_t)pp * pp, sizeof(int)), (int *)calloc_check((size_t)pp * pp, sizeof(int)),
                   (double *)calloc_check(pp, sizeof(double)), (double *)calloc_check(pp, sizeof(double)),
                   (double *)calloc_check(pp, sizeof(double)), 0};
    double *load = (double *)calloc_check(pp, sizeof(double)), *rate = (double *)calloc_check(pp, sizeof(double));
    for (int r = 0; r < pp; r++) {
        s.l[r] = pipeline_steps(schedule, pp, vpp, r, m, 0);
        if (core[r] < 0 || core[r] >= pp) { fail("pipe_shared: core %d of rank %d: a bug", core[r], r); }
    }
    do { shared_events(&s); } while (shared_advance(&s, core, weight, load, rate));
    double end = 0;
    for (int r = 0; r < pp; r++) { if (s.end_at[r] > end) { end = s.end_at[r]; } }
    for (int r = 0; r < pp; r++) { idle[r] = end - s.busy[r]; free(s.l[r].s); }
    free(s.l); free(s.pos); free(s.state); free(s.nsent); free(s.nrecv); free(s.rem); free(s.busy); free(s.end_at);
    free(load); free(rate);
    return end;
}

// The schedule on a model of time (pipe_walk; with core and weight, on shared processors: pipe_shared).
static double pipe_simulate(PipeSchedule schedule, int pp, int vpp, int m, const double *tf, const double *tb,
                            const double *tw, const int *core, const double *weight, double *idle) {
    if (core) { return pipe_shared(schedule, pp, vpp, m, tf, tb, tw, core, weight, idle); }
    return pipe_walk(schedule, pp, vpp, m, tf, tb, tw, idle);
}


// ----------------------------------------------------------------------------
// a step's seconds

// A step's time and where it goes (seconds; the comm: what is not overlapped with compute).
typedef struct { double total, compute, bubble, tp, cp, ep, pp, dp, optimizer; int stage; } StepTime;

// More ranks than cores (CPU ranks): the ranks are bound to the cores round-robin, as mpirun --map-by core
// places them (rank r on core r mod cores). The pipeline the model runs is that of the first ranks: stage s's
// rank s tp cp. core[s] is its core (numbered by first use, 0 to pp-1), weight[s] how many ranks of stage s share
// that core (they compute at the same time: the other pipelines' copies of the stage); the ranks of other stages
// on it compute between (pipe_simulate shares the core among them). Returns 0 (and sets nothing) when every rank
// has a core of its own.
static int stage_cores(const Layout *lay, int world, double cores, int *core, double *weight) {
    int nc = (int)cores, tc = lay->tp * lay->cp, ids[PIPE_MAX_LAYERS], nid = 0;
    if (cores <= 0 || world <= cores || nc < 1) { return 0; }
    for (int s = 0; s < lay->pp; s++) {
        int c = (s * tc) % nc, k = 0;
        while (k < nid && ids[k] != c) { k++; }
        if (k == nid) { ids[nid++] = c; }
        core[s] = k;
        weight[s] = 0;
        for (int q = c; q < world; q += nc) { weight[s] += (q / tc) % lay->pp == s; }
    }
    return 1;
}

// Each group's seconds per byte (bw) and per call (lat) for layout a of world ranks on machine mc.
typedef struct { double tp, cp, cpa, pp, ep, dp, emb; } GroupRates;   // cpa: cp's all-to-alls (U ranks)
static void group_rates(const Layout *lay, int world, int dp, const Machine *mc, GroupRates *bw, GroupRates *lat) {
    long tcp = (long)lay->tp * lay->cp;
    bw->tp = group_bw(mc, COMM_RING, lay->tp, lay->tp); bw->cp = group_bw(mc, COMM_P2P, lay->cp, tcp);
    bw->pp = group_bw(mc, COMM_P2P, lay->pp, tcp * lay->pp);
    bw->ep = group_bw(mc, COMM_A2A, lay->ep, tcp * lay->pp * lay->ep);
    bw->dp = group_bw(mc, COMM_RING, dp * lay->cp, world); bw->emb = group_bw(mc, COMM_RING, 2, tcp * lay->pp);
    lat->tp = group_lat(mc, COMM_RING, lay->tp, lay->tp); lat->cp = group_lat(mc, COMM_P2P, lay->cp, tcp);
    lat->pp = group_lat(mc, COMM_P2P, lay->pp, tcp * lay->pp);
    lat->ep = group_lat(mc, COMM_A2A, lay->ep, tcp * lay->pp * lay->ep);
    lat->dp = group_lat(mc, COMM_RING, dp * lay->cp, world); lat->emb = group_lat(mc, COMM_RING, 2, tcp * lay->pp);
    int U = cp_ulysses_degree(lay);   // (U consecutive cp ranks)
    bw->cpa = group_bw(mc, COMM_A2A, U, (long)lay->tp * U); lat->cpa = group_lat(mc, COMM_A2A, U, (long)lay->tp * U);
}

// One stage's seconds per micro-batch: its forward f, backward B b and W w (ZB runs them apart; the others B and W
// together), f + b + w (busy); its exposed tp, ep and cp per micro-batch; one way's messages of a micro-batch
// (p2p); its compute and exposed comm in a step (step_busy); its bytes and calls per group in a step.
typedef struct { double f, b, w, busy, tp, ep, cp, p2p, step_busy; CommBytes bytes, calls; } StageTime;

// --attention flash runs the flash kernels where they apply (a CUDA bf16 build, head size 64 or 128: attention.h),
// at flash_slower times cuBLAS's attention time; elsewhere cuBLAS's (or the CPU build's one attention)
static double attention_flash_factor(const Layout *lay, const ModelConfig *c, const Machine *mc) {
#if defined(USE_CUDA) && !defined(ENABLE_FP32)
    int hs = c->channels / c->num_heads;
    if (!strcmp(lay->attention, "flash") && (hs == 64 || hs == 128)) { return mc->flash_slower; }
#else
    (void)lay; (void)c; (void)mc;
#endif
    return 1.0;
}

static StageTime stage_time(const Layout *lay, const ModelConfig *c, const Machine *mc, const CommShape *sh, const int *first,
                            int s, int accum, const GroupRates *bw, const GroupRates *lat) {
    StageTime st;
    int n = lay->pp * lay->vpp;
    double C = c->channels, T = lay->T, X = sh->X, tokens = (double)lay->B * lay->T / lay->cp;   // a micro-batch's, a rank's
    int full = !strcmp(lay->recompute, "full"), mlp = !strcmp(lay->recompute, "mlp");
    double flash = attention_flash_factor(lay, c, mc);
    double ov = mc->overlap;   // the share of a collective that compute beside it hides
    double gemm = 0, attn = 0, layers = 0;   // FLOPs per token of the stage (this tp rank: / tp)
    for (int v = s; v < n; v += lay->pp) {
        for (int l = first[v]; l < first[v + 1]; l++) {
            gemm += layer_flops_per_token(c, l, lay->T) - 6.0 * C * T;
            attn += 6.0 * C * T / 2;   // (causal: half the T x T blocks)
            layers++;
        }
        if (v == n - 1) { gemm += head_flops_per_token(c); }
    }
    double g = tokens * gemm / lay->tp / machine_flops(mc, tokens), at = tokens * attn / lay->tp / mc->attn_flops * flash;
    // bandwidth-bound: each layer's LayerNorms, residuals, GELU, softmax read and write elem_passes (BTs, C)
    double elem = layers * mc->elem_passes * tokens / (lay->sp ? lay->tp : 1) * C * X / mc->mem_bw;
    double fixed = layers * mc->layer_cost;
    // each group's seconds per micro-batch: its bytes at its bandwidth, and a latency per call (the cp ring's
    // hops overlap attention, as far as the machine overlaps; cp's all-to-alls (Ulysses, the hybrid) are at the
    // all-to-all's rates over U ranks, and exposed: the attention waits for them)
    CommBytes cb = comm_step_bytes(sh, accum, comm_ep_rows_even(sh, accum), NULL), cn = comm_step_calls(sh, accum, NULL);
    CPAttnComm cpa = cp_attention_comm(sh);
    double a2a = sh->Ls * (cpa.a2a / bw->cpa + cpa.a2a_calls * lat->cpa);
    double ctp = (cb.tp / bw->tp + cn.tp * lat->tp) / accum, cep = (cb.ep / bw->ep + cn.ep * lat->ep) / accum;
    double ccp = ((cb.cp - accum * sh->Ls * cpa.a2a) / bw->cp + (cn.cp - accum * sh->Ls * cpa.a2a_calls) * lat->cp) / accum;
    double cp_exposed = ccp - ov * fmin(ccp, at) + a2a;
    // forward a third of the compute, backward two thirds (B: the inputs' gradients, W: the weights');
    // recompute: mlp runs fc and GELU again (an eighth of a dense layer's GEMMs), full the whole forward
    double fwd = (g + at) / 3 + elem / 3 + fixed / 3;
    double again = full ? fwd : mlp ? g / 3 / 8 : 0;
    double f = fwd + (ctp + cep) / 2 + cp_exposed / 2;
    double bwd = 2 * (g + at) / 3 + 2 * elem / 3 + 2 * fixed / 3 + again + (ctp + cep) / 2 + cp_exposed / 2;
    double w = g / 3;   // (the W pass: the weights' gradients, a forward's GEMMs)
    st.step_busy = accum * (f + bwd) + cb.pp / bw->pp + cn.pp * lat->pp;
    st.f = f; st.b = bwd - w; st.w = w; st.busy = f + bwd;
    st.tp = ctp; st.ep = cep; st.cp = cp_exposed;
    st.p2p = (cb.pp / bw->pp + cn.pp * lat->pp) / accum / 2;   // one way's messages of a micro-batch
    st.bytes = cb; st.calls = cn;
    return st;
}

// The pipeline: each stage's passes through the schedule's own step lists (each message on the critical path;
// interleaved: a chunk's passes a vpp-th of its stage's); without one, the micro-batches one after another.
static double pipeline_seconds(const Layout *lay, int accum, const StageTime *st, double p2p, const int *core,
                               const double *share) {
    if (lay->pp == 1) { return accum * (st[0].f + st[0].b + st[0].w) * share[0]; }
    double idle[PIPE_MAX_LAYERS], f[PIPE_MAX_LAYERS], b[PIPE_MAX_LAYERS], w[PIPE_MAX_LAYERS], v = lay->vpp;
    PipeSchedule sch = lay->vpp > 1 ? SCHEDULE_INTERLEAVED : pipe_schedule(lay->pp_schedule);
    int zb = sch == SCHEDULE_ZB;
    for (int s = 0; s < lay->pp; s++) {
        f[s] = (st[s].f + p2p) / v;
        b[s] = (st[s].b + (zb ? 0 : st[s].w) + p2p) / v;
        w[s] = zb ? st[s].w : 0;
    }
    return pipe_simulate(sch, lay->pp, lay->vpp, accum, f, b, w, core, core ? share : NULL, idle);
}

// dp (the worst stage): what the code overlaps with the backward (as far as the machine's overlap hides it),
// and what it cannot
//   ZeRO 0: the all-reduce of each unit starts after its last backward: the last micro-batch's backward
//   ZeRO 1: so does the reduce-scatter; the all-gather of the updated parameters follows the optimizer
//   ZeRO 2: a reduce-scatter per micro-batch, each during its backward; then the all-gather
//   ZeRO 3: the gathers are prefetched during the forward and backward, the reduce-scatters during the
//           backward, per micro-batch; no all-gather at the end
// Sets t->dp and t->optimizer (AdamW's seconds); returns every rank's busy seconds, summed.
static double dp_and_optimizer(const Layout *lay, int world, int accum, const Machine *mc, const CommShape *shapes,
                               const StageTime *st, const GroupRates *bw, const GroupRates *lat, const double *share,
                               StepTime *t) {
    double X = shapes[0].X, ov = mc->overlap, dp_exposed = 0, opt = 0, work = 0;
    for (int s = 0; s < lay->pp; s++) {
        const CommShape *sh = &shapes[s];
        const CommBytes *cb = &st[s].bytes, *cn = &st[s].calls;
        double ring = 0, units = 0;   // one reduce-scatter's (or all-gather's) bytes of every unit, dp and edp; the units
        for (int i = 0; i < 2; i++) {
            int p = i == 0 ? sh->dp : sh->edp;
            if (p > 1) { ring += (p - 1.0) / p * X * sh->units[i]; units += sh->nunits[i]; }
        }
        double rs = ring / bw->dp + units * lat->dp, ar = 2 * ring / bw->dp + units * lat->dp, e;   // (a call per unit)
        double bk = (st[s].b + st[s].w) * share[s], z3 = ((cb->dp + cb->edp) / bw->dp + (cn->dp + cn->edp) * lat->dp) / accum;
        if (sh->zero == 0) { e = ar - ov * fmin(ar, bk); }
        else if (sh->zero == 1) { e = rs - ov * fmin(rs, bk) + rs; }
        else if (sh->zero == 2) { e = accum * (rs - ov * fmin(rs, bk)) + rs; }
        else { e = accum * (z3 - ov * fmin(z3, st[s].f * share[s] + bk)); }
        e += cb->emb / bw->emb + cn->emb * lat->emb;   // (the first and the last stage)
        dp_exposed = fmax(dp_exposed, e * share[s]);
        // AdamW over the owned elements: parameter, gradient, m, v (and fp32 master) read and written
        double owned = sh->zero == 0 ? sh->units[0] + sh->units[1] : sh->units[0] / sh->dp + sh->units[1] / sh->edp;
        double o = mc->adamw > 0 ? owned / mc->adamw : owned * (2.0 * X + 8 + 8 + (X == 2 ? 8 : 0)) / mc->mem_bw;
        opt = fmax(opt, o * share[s]);
        work += (double)world / lay->pp * (st[s].step_busy + e + o);
    }
    t->dp = dp_exposed;
    t->optimizer = opt;
    return work;
}

// Seconds per step of layout a (world ranks, its plan's CommShape per stage in shapes).
static StepTime plan_step_time(const Layout *lay, const ModelConfig *c, int world, const Machine *mc,
                               const CommShape *shapes) {
    StepTime t;
    memset(&t, 0, sizeof(t));
    int dp = world / (lay->tp * lay->cp * lay->pp), accum = lay->total_batch / (lay->B * lay->T * dp);
    int first[PIPE_MAX_LAYERS + 1], core[PIPE_MAX_LAYERS];   // more ranks than cores: each stage's core and its ranks
    double share[PIPE_MAX_LAYERS];                           // on it (stage_cores), else 1
    char err[256];
    if (layer_split(first, lay->pp_layers, c, lay->T, lay->pp, lay->vpp, err, sizeof(err))) { fail("%s", err); }
    double slow = mc->cores > 0 && world > mc->cores ? world / mc->cores : 1.0;   // ranks sharing the cores
    int shared = stage_cores(lay, world, mc->cores, core, share);
    if (!shared) { for (int s = 0; s < lay->pp; s++) { share[s] = 1; } }
    GroupRates bw, lat;
    group_rates(lay, world, dp, mc, &bw, &lat);
    StageTime *st = (StageTime *)malloc_check(lay->pp * sizeof(StageTime));
    double busy = 0, p2p = 0;   // the slowest stage's, per micro-batch
    for (int s = 0; s < lay->pp; s++) {
        st[s] = stage_time(lay, c, mc, &shapes[s], first, s, accum, &bw, &lat);
        if (st[s].busy * share[s] > busy) { busy = st[s].busy * share[s]; t.stage = s; }
        t.tp = fmax(t.tp, accum * st[s].tp); t.ep = fmax(t.ep, accum * st[s].ep); t.cp = fmax(t.cp, accum * st[s].cp);
        p2p = fmax(p2p, st[s].p2p);
    }
    t.compute = accum * busy - t.tp - t.ep - t.cp;
    double pipe = pipeline_seconds(lay, accum, st, p2p, shared ? core : NULL, share);
    if (lay->pp > 1) { t.pp = accum * 2 * p2p; }
    t.bubble = pipe - accum * busy - t.pp > 0 ? pipe - accum * busy - t.pp : 0;
    double work = dp_and_optimizer(lay, world, accum, mc, shapes, st, &bw, &lat, share, &t);
    free(st);
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

#endif // LLMC_COST_MODEL_H
