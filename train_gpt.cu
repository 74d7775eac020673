/*
GPT-2 and Llama-family training, single source, CPU or CUDA, any mix of data / ZeRO / tensor+sequence / context / pipeline
(1F1B, GPipe, interleaved, zero-bubble) / expert parallelism. This file is the model (its units, parameters, forward, fused head, backward, update)
and the program (set-up, the training loop, main), read top to bottom; each parallel strategy and each
other concern lives in one file of llmc/, listed below with what it defines.
*/
#include <unistd.h>
#include <time.h>
// the machine
#include "llmc/utils.h"             // defines: fail, fail_all (the error rule), checked allocation and file I/O
#include "llmc/backend.h"           // defines: floatX, device memory and copies, streams, CUDA/cuBLAS error checks
#include "llmc/alloc.h"             // defines: mem_alloc (the one allocator, by category), the memory report, plans
#include "llmc/grid.h"              // defines: Grid, Group: the process grid and its groups (communicators)
#include "llmc/comm.h"              // defines: the collectives (device and host), the comm report
#include "llmc/rand.h"              // defines: Rng (the model's init and sampling)
#include "llmc/model_config.h"      // defines: ModelConfig (every family), the tensors in file order (TensorSpec)
#include "llmc/seq_layout.h"        // defines: SeqPos: where a rank's tokens are in the sequence (cp chunks)
#include "llmc/layout.h"            // defines: Layout: how the run is cut over ranks and micro-batches; layout_error
#include "llmc/test_hooks.h"        // defines: the few places a test reaches into the program
#include "llmc/span.h"              // defines: Span: the flight recorder, the trace and the cost clock in one call
// the kernels: a CPU loop (the specification) beside each CUDA kernel, one launcher each
#include "llmc/encoder.h"           // defines: vocab-parallel token embedding, position embedding
#include "llmc/layernorm.h"         // defines: layernorm_forward/backward
#include "llmc/matmul.h"            // defines: matmul_forward (+GELU), matmul_backward, bias_backward
#include "llmc/attention.h"         // defines: causal attention (cuBLAS or flash_attention.h), forward and backward
#include "llmc/gelu.h"              // defines: GELU (tanh) forward and backward
#include "llmc/rmsnorm.h"           // defines: RMSNorm (Llama); a model's norm, LayerNorm or RMSNorm
#include "llmc/rope.h"              // defines: rotary position embeddings (Llama), at each token's position
#include "llmc/qk_norm.h"           // defines: QK-norm (OLMoE): RMSNorm over the whole q and k projections, over tp
#include "llmc/swiglu.h"            // defines: SwiGLU (Llama); a model's MLP activation, GELU or SwiGLU
#include "llmc/residual.h"          // defines: residual + bias, fused residual + LayerNorm
#include "llmc/fused_ce.h"          // defines: fused_classifier: the LM head and the loss chunk by chunk, vocab-parallel
#include "llmc/adamw.h"             // defines: AdamW (multi-tensor)
#include "llmc/global_norm.h"       // defines: the gradient norm's partial sums, the clip scale, the skip
#include "llmc/moe.h"               // defines: the MoE layer's semantics and kernels (router, top-k, capacity, losses)
// the parallel strategies
#include "llmc/tensor_parallel.h"   // defines: tp_all_tokens, tp_sum_partials (Megatron TP + SP), tp slices
#include "llmc/context_parallel.h"  // defines: ring attention, Ulysses and the hybrid over the cp ranks
#include "llmc/zero.h"              // defines: Zero: data parallel + ZeRO 0-3 over units
#include "llmc/muon.h"              // defines: Muon: each matrix orthogonalised once in the job, under any layout
#include "llmc/pipeline.h"          // defines: Pipeline: 1F1B, GPipe, interleaved, ZB schedules as step lists
#include "llmc/pipeline_split.h"    // defines: the layers of each stage (--pp-layers), from the FLOPs or a run's costs
#include "llmc/stage_costs.h"       // defines: StageCosts: the seconds a run measures per stage, reported, written
#include "llmc/expert_parallel.h"   // defines: ExpertParallel: a MoE layer over the ep group (all-to-all)
// the program
#include "llmc/dataloader.h"        // defines: DataLoader (llm.c's shards and order), the built-in corpus, the run's data
#include "llmc/tokenizer.h"         // defines: Tokenizer (llm.c's tokenizer.bin, decoding)
#include "llmc/schedulers.h"        // defines: the learning rate schedules
#include "llmc/model_file.h"        // defines: model files, descriptors, init (over model_config.h's shape and tensors)
#include "llmc/model_units.h"       // defines: a stage's units (zero.h's, from the tensor table), cut and put back
#include "llmc/upcycle.h"           // defines: sparse upcycling (a MoE model from a dense one)
#include "llmc/run_dir.h"           // defines: the run directory: lock, identity, retention, unusable/, main.log
#include "llmc/checkpoint.h"        // defines: layout-independent checkpoints: save, load
#include "llmc/args.h"              // defines: Args (a Layout, the other flags), the flags, the model they make
#include "llmc/cost_model.h"        // defines: the machine, a step's bytes per group by formula, the step-time model
#include "llmc/plan.h"              // defines: the memory plan of any rank
#include "llmc/layout_search.h"     // defines: --plan's report and levers, the memory check, plan_search
#include "llmc/calibrate.h"         // defines: calibrate: this machine's rates for the cost model (--machine)
#include "llmc/report.h"            // defines: the step line, the first step's reports, the times at the end
#include "llmc/hellaswag.h"         // defines: HellaSwag (llm.c's eval file) and its rows
#include "llmc/sampler.h"           // defines: Sampler, sample_token (temperature, top-k)

// ----------------------------------------------------------------------------
// the model

typedef struct {
    // stored for the backward, one set per micro-batch in flight through one model chunk of this
    // pipeline stage (the stage's layers without interleaving). Per layer l of the chunk's Lc layers
    // (layer_acts cuts one layer's slice); BTs = tokens of the LayerNorm/residual region (BT/tp with SP,
    // else BT), Cl = C/tp, NHl = NH/tp. "Ls" below: the chunk's layers.
    floatX *resid;      // (Ls+1, BTs, C) the residual stream entering each layer, and the chunk's output
    floatX *ln1;        // (Ls, BTs, C)
    float *ln1_mean, *ln1_rstd;   // (Ls, BTs)
    floatX *qkv;        // (Ls, BT, 3Cl)
    floatX *qkraw;      // (Ls, BT, (NHl + KVl) hs) QK-norm: q's rows, then k's, before the norm
    float *qkrstd;      // (Ls, 2, BT) QK-norm: q's and k's scales
    floatX *atty;       // (Ls, BT, Cl)
    float *lse;         // (Ls, B, NHl, T) attention log-sum-exp
    floatX *mid;        // (Ls, BTs, C) residual after attention
    floatX *ln2;        // (Ls, BTs, C)
    float *ln2_mean, *ln2_rstd;
    floatX *fch, *fchg; // (dense layers of the chunk, BT, 4Cl) fc output, after GELU
    MoEActs *moe;       // (Ls) the MoE layers' routing and expert activations (unused for dense layers)
    floatX *lnf;        // (BTs, C) the last stage's last chunk
    float *lnf_mean, *lnf_rstd;
    floatX *dlnf;       // (BTs, C) last stage: the gradient of lnf, written by the fused head
    int *inputs, *targets;   // (BT) on the device: the tokens (first chunk), the targets (last chunk)
} Activations;

// One layer's slice of a micro-batch's activations.
typedef struct {
    floatX *res, *ln1, *mid, *ln2, *out;                 // (BTs, C): input, ln1, after attention, ln2, output
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;   // (BTs)
    floatX *qkv, *atty, *fch, *fchg;                     // (BT, 3Cl), (BT, Cl), (BT, 4Cl), (BT, 4Cl): fch only dense
    floatX *qkraw; float *qkrstd;                        // QK-norm: (BT, (NHl + KVl) hs), (2, BT)
    float *lse;                                          // (B, NHl, T)
    MoEActs *moe;                                        // MoE layers
} LayerActs;

typedef struct {        // shared by all layers and micro-batches
    floatX *xfull;      // (BT, C) gathered input of a column-parallel layer (SP only)
    floatX *pfull;      // (BT, C) partial sums before a tp reduction, and full-token gradients
    floatX *tokbuf;     // (BTs, C) result of a reduce-scatter (SP)
    floatX *dresid;     // (BTs, C) gradient of the residual stream (pipeline: received from the next stage)
    floatX *dwide;      // (BT, max(FCl, QKVl)) gradient of fc's output, then of qkv
    floatX *dact;       // (BT, Fl) SwiGLU: the gradient of the MLP's activation
    floatX *datty;      // (BT, Cl)
    float *qkss;        // (2, BT) QK-norm: the tokens' sums over q and k (squares, then products), all-reduced
    float *losses;      // (BT)
    double *loss_sum;   // (1) the losses of the step's micro-batches (or the evaluation's batches), summed
} Workspace;

// ZB (--pp-schedule zb): what a layer's W pass needs beyond the stored activations, kept from its B: the
// gradients of its linear layers' outputs, the LayerNorms' parameter gradients (cheap, O(BT C): B computes them
// into lnp instead of keeping the LayerNorms' output gradients), and what is not in the slot: (SP) ln1 and ln2 of
// all tokens, kept as B gathered them (W makes no tp traffic); what B recomputed (--recompute mlp: the GELU
// output; full: also ln1, ln2 of all tokens and the attention output: B's recomputation writes them here). One
// set per layer per pending W pass (pipeline.h's npending); the unit's gradients all wait for W (lnp is added
// there), so a unit's gradient is opened, accumulated and reduced (zero.h) in W alone.
typedef struct {
    floatX *dfcproj, *dattproj;   // (BT, C) the gradients of fcproj's and attproj's outputs, all tokens
    floatX *dfc, *dqkv;           // (BT, 4Cl), (BT, 3Cl) of fc's (before the GELU) and qkv's outputs
    floatX *lnp;                  // (4, C) ln2's weight and bias gradients, then ln1's (this micro-batch's alone)
    floatX *xln2, *xln1;          // (BT, C) SP or full: ln2 and ln1 of all tokens (NULL: the slot's y.ln2, y.ln1)
    floatX *fchg;                 // (BT, 4Cl) recompute: the GELU output (NULL: the slot's y.fchg)
    floatX *atty;                 // (BT, Cl) full: the attention output (NULL: the slot's y.atty)
    // a MoE layer (instead of fcproj's and fc's): what its experts', shared experts' and router's W needs
    // (expert_parallel.h), and what B recomputed (recompute: the rows' GELU output hg, the shared experts' shg;
    // full: the rows' input xe) in buffers of its own, through a copy of the layer's MoEActs pointing at them
    MoEWGrads moe;
    floatX *hg, *shg, *xe;        // (Rr, Hl), (BT, SHl), (Rr, C)
    MoEActs acts;
} WGrads;

// ZB: the layers' pending W passes: pipeline.h's npending sets of every layer's WGrads (wgrads_layout's layout).
typedef struct {
    floatX *elems;               // their tensors
    float *floats;               // their fp32 tensors (the router logits' gradient)
    int *counts;                 // host (npending, MoE layers, ep, E): the dispatch's rows
} WStore;

// The model on this rank, whatever its family (GPT-2, Llama, their MoE forms): its shape, its place in the grid, its
// units, parameters, gradients, activations and the state of its parallel strategies.
typedef struct {
    ModelConfig config;
    Grid *grid;
    int sp;
    int B, T, BT, BTs, tok0;     // T: the tokens of a sequence this rank holds (with cp: T/cp); tok0: first local
                                 // token of the LayerNorm/residual region
    SeqPos seqpos;               // where the local tokens are in the sequence (seq_layout.h)
    CPRing cpring;               // cp's attention: the ring, Ulysses or the hybrid, its layout and buffers
    int Cl, NHl, Vl, v0;         // this tp rank's channels, heads, vocab rows [v0, v0 + Vl)
    int KVl, hs, QKVl, FCl, Fl;  // its kv heads; the head size; the widths of its qkv rows ((NHl + 2 KVl) hs), of
                                 // fc's output (GPT-2: 4C/tp; Llama: [gate | up] 2F/tp) and of the MLP's activation
    int rms, swiglu;             // Llama's ops: RMSNorm for LayerNorm, SwiGLU for GELU, RoPE for wpe
    int QKn;                     // QK-norm (OLMoE): the width of a token's q and k on this rank, (NHl + KVl) hs; 0: none
    float *rope;                 // Llama: (maxT, hs) RoPE's cos and sin (rope.h), on the device
    int first, last, Ls, vpp;      // pipeline: is this the first / last stage; its layers; its model chunks
    int *layer_id;               // (Ls) the model layer of each of the stage's layers (chunk by chunk)
    int *chunk_l0;               // (vpp+1) chunk v's layers are the stage's [chunk_l0[v], chunk_l0[v+1])
    int nunits, u_embed, u_pos, u_final, u_head;   // this stage's units (zero.h), -1 where it has none
    int *u_layer, *u_experts;    // (Ls) each layer's unit; its experts' unit (-1: a dense layer)
    Unit *units;
    Zero zero;
    Muon muon;              // --optimizer muon (muon.h); muon.world NULL: AdamW everywhere
    Pipeline pipe;               // the schedule, the activation slots, the exchanges (pipeline.h)
    Activations *acts;           // (pipe.nslots) one per (micro-batch, model chunk) alive at once (pipeline.h's slots)
    Workspace ws;
    CEBuffers ce;
    size_t num_parameters;
    // the MoE layers: shape and options, routing bias, dispatch, buffers, the step's numbers (expert_parallel.h)
    ExpertParallel moe;
    Recompute recompute;         // what the backward recomputes instead of storing (see layer_acts)
    int recomputing;             // the forward running now is a recomputation (its MoE numbers are not counted again)
    Activations scratch;         // one layer's worth of what is recomputed, shared by the layers and micro-batches
    int micro;                   // the micro-batch running (for --trace, and the MoE layers' routing log)
    int *step_tokens;            // (2, accum, BT) page-locked: a step's inputs and targets, uploaded without a wait
    int *fwd_tokens;             // (2, BT) a forward-only pass's inputs and targets (validation, sampling)
    // beside the model: ZB's pending W passes, the instruments' measured costs, the guard's counters
    int defer_w;                 // ZB: the layers' weight gradients wait for the W pass
    WStore wstore;
    StageCosts costs;            // --comm-report with a pipeline (stage_costs.h)
    UpdateGuard guard;           // the updates applied and skipped, the limits of the next (global_norm.h)
} Model;

// The model chunk holding the stage's layer l.
static int layer_chunk(const Model *m, int l) {
    int v = 0;
    while (l >= m->chunk_l0[v + 1]) { v++; }
    return v;
}

// A span of the model's work (span.h): the flight recorder's layer, a trace span (name NULL: none), and its seconds
// for the stage's costs when a step runs under --comm-report with a pipeline.
static Span model_span(const Model *m, int layer, const char *name, const char *cat) {
    return span_open(layer, m->costs.in_step && m->pipe.time_waits && m->grid->pp > 1, name, cat);
}

// The stage's layer l's slice of a micro-batch's activations (acts: a slot of l's chunk). What the
// backward recomputes lives in m->scratch (one layer): under mlp the fc and GELU outputs, under full
// everything but the layer's input and output (the residual stream, always stored).
static LayerActs layer_acts(const Model *m, const Activations *acts, int l) {
    int full = m->recompute == RECOMPUTE_FULL, mlp = m->recompute != RECOMPUTE_NONE,
        l0 = m->chunk_l0[layer_chunk(m, l)];
    const Activations *h = full ? &m->scratch : acts;   // where the per-layer tensors are
    size_t C = m->config.channels, Cl = m->Cl, lc = l - l0, li = full ? 0 : lc, s = li * m->BTs, f = li * m->BT;
    size_t dense = 0;   // dense layers of the chunk before l (the fc outputs are stored for those only)
    for (int i = l0; i < l && !mlp; i++) { dense += !is_moe_layer(&m->config, m->layer_id[i]); }
    const Activations *fc = mlp ? &m->scratch : acts;
    LayerActs x;
    x.res = acts->resid + lc * m->BTs * C; x.out = acts->resid + (lc + 1) * m->BTs * C;
    x.ln1 = h->ln1 + s * C; x.mid = h->mid + s * C; x.ln2 = h->ln2 + s * C;
    x.ln1_mean = h->ln1_mean + (m->rms ? 0 : s);
    x.ln1_rstd = h->ln1_rstd + s;
    x.ln2_mean = h->ln2_mean + (m->rms ? 0 : s);
    x.ln2_rstd = h->ln2_rstd + s;
    x.qkv = h->qkv + f * m->cpring.qkv_w; x.atty = h->atty + f * Cl;
    x.qkraw = h->qkraw + f * m->QKn; x.qkrstd = h->qkrstd + 2 * f;
    x.fch = fc->fch + dense * m->BT * m->FCl; x.fchg = fc->fchg + dense * m->BT * m->Fl;
    x.lse = h->lse + f * m->NHl;
    x.moe = &h->moe[li];
    return x;
}

// Builds this rank's part of the model (its pipeline stage, its tp slice, its experts, its ZeRO shard)
// from the full host tensors (file order). Every rank passes the same.
static void gpt2_build(Model *m, const ModelConfig *c, float *all_params, Grid *grid, int vpp, const int *first,
                       int zero_stage, int sp, MoEOptions moe, int muon) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->grid = grid;
    m->sp = sp;
    m->num_parameters = num_parameters(c);
    int tp = grid->tp;
    m->Cl = c->channels / tp; m->NHl = c->num_heads / tp;
    m->Vl = c->padded_vocab_size / tp; m->v0 = grid->tp_rank * m->Vl;
    m->rms = m->swiglu = c->arch == ARCH_LLAMA;
    m->KVl = c->kv_heads / tp; m->hs = c->channels / c->num_heads; m->QKVl = (m->NHl + 2 * m->KVl) * m->hs;
    m->Fl = c->ffn_hidden / tp; m->FCl = m->swiglu ? 2 * m->Fl : m->Fl;
    m->QKn = c->qk_norm ? (m->NHl + m->KVl) * m->hs : 0;
    m->first = grid->pp_rank == 0;
    m->last = grid->pp_rank == grid->pp - 1;
    m->vpp = vpp;
    m->chunk_l0 = (int *)malloc_check((vpp + 1) * sizeof(int));
    m->layer_id = (int *)malloc_check((c->num_layers + 1) * sizeof(int));
    m->Ls = 0;
    for (int v = 0; v < vpp; v++) {
        int l0, l1;
        chunk_layers(first, grid->pp, grid->pp_rank, v, &l0, &l1);
        m->chunk_l0[v] = m->Ls;
        for (int l = l0; l < l1; l++) { m->layer_id[m->Ls++] = l; }
    }
    m->chunk_l0[vpp] = m->Ls;
    m->costs.layer = (double *)calloc_check(m->Ls + 1, sizeof(double));
    m->units = (Unit *)malloc_check((2 * m->Ls + 4) * sizeof(Unit));
    m->u_layer = (int *)malloc_check((m->Ls + 1) * sizeof(int));
    m->u_experts = (int *)malloc_check((m->Ls + 1) * sizeof(int));
    m->nunits = build_units(c, grid, vpp, first, m->units, &m->u_embed, &m->u_pos, m->u_layer, m->u_experts,
                            &m->u_final, &m->u_head);
    if (muon) { muon_mark_units(m->units, m->nunits); }   // (before zero_init: Muon's elements have no AdamW v)
    zero_init(&m->zero, grid, zero_stage, sp, m->units, m->nunits);
    moe_setup(&m->moe, c, grid, moe, m->layer_id, m->Ls);
    if (m->rms) { m->rope = (float *)mem_alloc((size_t)c->max_seq_len * m->hs * sizeof(float), MEM_WORKSPACE); }
    if (all_params == NULL) { return; }   // (a plan: the sizes only)
    if (m->rope) { rope_setup(m->rope, c->max_seq_len, m->hs, c->rope_theta, &c->rope); mem_keep(m->rope); }
    moe_set_bias(&m->moe, all_params + num_parameters(c));   // (the routing bias follows the parameters)
    float *full[NUM_TENSORS];
    split_tensors(c, all_params, full);
    for (int u = 0; u < m->nunits; u++) {
        float *host = (float *)malloc_check(m->units[u].size * sizeof(float));
        unit_copy_full(c, &m->units[u], full, host, tp, grid->tp_rank, 1);
        zero_set_unit_params(&m->zero, u, host);
        free(host);
    }
}

// One activation slot (scratch 0), or the recompute scratch (1): the residual stream and, unless
// recomputed, every layer's tensors, for any of the stage's chunks (the slots are shared: each holds the
// largest chunk, Lc layers of which at most Ldc dense, a MoE layer's tensors at each position where some
// chunk has one: moe_at); what is recomputed in the scratch, one layer (of each kind the stage has) for
// all layers and slots.
static void slot_alloc(Model *m, Activations *acts, int scratch, int Lc, int Ldc, int Ld, const int *moe_at) {
    const ModelConfig *c = &m->config;
    size_t C = c->channels, Cl = m->Cl, BT = m->BT, BTs = m->BTs, X = floatx_bytes(), F = sizeof(float);
    int full = m->recompute == RECOMPUTE_FULL, mlp = m->recompute != RECOMPUTE_NONE;
    memset(acts, 0, sizeof(*acts));
    size_t n = scratch ? (full ? 1 : 0) : (full ? 0 : Lc);                 // layers of the per-layer tensors here
    size_t nfc = scratch ? (mlp && Ld > 0 ? 1 : 0) : (mlp ? 0 : Ldc);      // ... of fc and GELU outputs
    if (!scratch) { acts->resid = (floatX *)mem_alloc((Lc + 1) * BTs * C * X, MEM_ACTIVATIONS); }
    acts->ln1 = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
    size_t nmean = m->rms ? 0 : n;   // (RMSNorm: no mean)
    acts->ln1_mean = (float *)mem_alloc(nmean * BTs * F, MEM_ACTIVATIONS);
    acts->ln1_rstd = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
    acts->qkv = (floatX *)mem_alloc(n * BT * m->cpring.qkv_w * X, MEM_ACTIVATIONS);
    acts->qkraw = (floatX *)mem_alloc(n * BT * m->QKn * X, MEM_ACTIVATIONS);
    acts->qkrstd = (float *)mem_alloc((m->QKn ? n : 0) * 2 * BT * F, MEM_ACTIVATIONS);
    acts->atty = (floatX *)mem_alloc(n * BT * Cl * X, MEM_ACTIVATIONS);
    acts->lse = (float *)mem_alloc(n * BT * m->NHl * F, MEM_ACTIVATIONS);
    acts->mid = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
    acts->ln2 = (floatX *)mem_alloc(n * BTs * C * X, MEM_ACTIVATIONS);
    acts->ln2_mean = (float *)mem_alloc(nmean * BTs * F, MEM_ACTIVATIONS);
    acts->ln2_rstd = (float *)mem_alloc(n * BTs * F, MEM_ACTIVATIONS);
    acts->fch = (floatX *)mem_alloc(nfc * BT * m->FCl * X, MEM_ACTIVATIONS);
    acts->fchg = (floatX *)mem_alloc(nfc * BT * m->Fl * X, MEM_ACTIVATIONS);
    acts->moe = (MoEActs *)calloc_check(Lc + 1, sizeof(MoEActs));
    for (int l = 0; l < Lc; l++) {
        // the MoE layers' routing and expert rows: stored per layer, or (full) one set in the scratch;
        // the experts' fc and GELU outputs: stored, or (mlp, full) one set in the scratch
        if (!(scratch ? is_moe_layer(c, m->layer_id[l]) : moe_at[l]) || (scratch && !mlp)) { continue; }
        int routing = scratch ? full : !full, hidden = scratch ? mlp : !mlp;
        if (scratch && full && acts->moe[0].probs) { continue; }   // one set
        if (scratch && !full && acts->moe[0].h) { continue; }
        moe_acts_alloc(&acts->moe[scratch ? 0 : l], &m->moe, routing, hidden);
    }
    if (!scratch && m->last) {   // (the last chunk's)
        acts->lnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
        acts->lnf_mean = (float *)mem_alloc((m->rms ? 0 : BTs) * F, MEM_ACTIVATIONS);
        acts->lnf_rstd = (float *)mem_alloc(BTs * F, MEM_ACTIVATIONS);
        acts->dlnf = (floatX *)mem_alloc(BTs * C * X, MEM_ACTIVATIONS);
    }
    if (!scratch && m->first) { acts->inputs = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS); }   // (chunk 0's)
    // (the last chunk's)
    if (!scratch && m->last) {
        acts->targets = (int *)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS);
    }
}

// The buffers shared by the layers and micro-batches: ring attention's, the workspace, the MoE layers'
// (any), the fused head's one CE chunk of `chunk` tokens (0: all) on the last stage.
static void workspace_alloc(Model *m, int chunk, int any_moe) {
    size_t C = m->config.channels, Cl = m->Cl, BT = m->BT, BTs = m->BTs, X = floatx_bytes(), F = sizeof(float);
    int tp = m->grid->tp;
    Workspace *w = &m->ws;
    cp_attention_alloc(&m->cpring, BT);   // cp: the ring's keys and values (held, arriving, gradients), all-to-alls'
    w->xfull = m->sp && tp > 1 ? (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE) : NULL;
    w->pfull = (floatX *)mem_alloc(BT * C * X, MEM_WORKSPACE);
    w->tokbuf = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dresid = (floatX *)mem_alloc(BTs * C * X, MEM_WORKSPACE);
    w->dwide = (floatX *)mem_alloc(BT * (m->FCl > m->QKVl ? m->FCl : m->QKVl) * X, MEM_WORKSPACE);
    w->dact = m->swiglu ? (floatX *)mem_alloc(BT * m->Fl * X, MEM_WORKSPACE) : NULL;
    w->datty = (floatX *)mem_alloc(BT * Cl * X, MEM_WORKSPACE);
    w->qkss = (float *)mem_alloc((m->QKn ? 2 * BT : 0) * F, MEM_WORKSPACE);
    if (any_moe) { moe_work_alloc(&m->moe); }
    if (m->last) {
        w->losses = (float *)mem_alloc(BT * F, MEM_LOGITS);
        w->loss_sum = (double *)mem_alloc(sizeof(double), MEM_LOGITS);
        m->ce.chunk = chunk > 0 && chunk < m->BT ? chunk : m->BT;
        m->ce.logits = (floatX *)mem_alloc((size_t)m->ce.chunk * m->Vl * X, MEM_LOGITS);
        m->ce.stats = (float *)mem_alloc((size_t)m->ce.chunk * 3 * F, MEM_LOGITS);
        m->ce.stats_all = (float *)mem_alloc((size_t)tp * m->ce.chunk * 3 * F, MEM_LOGITS);
    }
}

// ZB: one layer's WGrads (a MoE layer's if moe) laid out from q (floatX) and qf (fp32); NULL bases only count.
// Returns the floatX elements it takes, *floats the fp32 ones: the W store holds npending sets of every layer's.
static size_t wgrads_layout(const Model *m, int moe, floatX *q, float *qf, WGrads *d, size_t *floats) {
    size_t C = m->config.channels, Cl = m->Cl, BT = m->BT, Rr = m->moe.buf.rows_recv, Hl = m->moe.shape.Hl,
           SHl = m->moe.shape.SHl, E = m->config.num_experts, n = 0;
    int full = m->recompute == RECOMPUTE_FULL, rec = m->recompute != RECOMPUTE_NONE;
    memset(d, 0, sizeof(*d));
    #define TAKE(ptr, count) ((ptr) = q ? q + n : NULL, n += (count))
    TAKE(d->dattproj, BT * C); TAKE(d->dqkv, BT * m->QKVl); TAKE(d->lnp, 4 * C + m->QKn);
    if ((m->sp && m->grid->tp > 1) || full) { TAKE(d->xln2, BT * C); TAKE(d->xln1, BT * C); }
    if (full) { TAKE(d->atty, BT * Cl); }
    if (!moe) {
        TAKE(d->dfcproj, BT * C); TAKE(d->dfc, BT * m->FCl);
        if (rec) { TAKE(d->fchg, BT * m->Fl); }
    } else {
        if (SHl > 0) { TAKE(d->moe.dy, BT * C); TAKE(d->moe.sdh, BT * m->moe.shape.SHw); }
        TAKE(d->moe.dye, Rr * C); TAKE(d->moe.dh, Rr * m->moe.shape.Hw);
        if (rec) { TAKE(d->hg, Rr * Hl); }
        if (rec && SHl > 0) { TAKE(d->shg, BT * SHl); }
        if (full) { TAKE(d->xe, Rr * C); }
        d->moe.dlogits = qf;
        d->moe.dsgate = m->moe.shape.shared_gate && qf ? qf + BT * E : NULL;
    }
    #undef TAKE
    *floats = moe ? BT * E + (m->moe.shape.shared_gate ? BT : 0) : 0;
    return n;
}

// Allocates the activations for micro-batches of (B, T), `accum` of them per step, with the pipeline
// schedule's number of (micro-batch, model chunk) pairs alive at once, and a CE chunk of `chunk` tokens
// (0: all). MoE dispatch buffers are sized for the capacity factor, or dropless when the run samples or scores
// HellaSwag (moe_dropless).
static void gpt2_alloc_activations(Model *m, int B, int T, int chunk, int accum, PipeSchedule schedule,
                                   int moe_dropless) {
    const ModelConfig *c = &m->config;
    int tp = m->grid->tp, pp = m->grid->pp, cp = m->grid->cp, Ls = m->Ls, vpp = m->vpp;
    m->B = B; m->T = T; m->BT = B * T;
    m->BTs = m->sp ? m->BT / tp : m->BT;
    m->tok0 = m->sp ? m->grid->tp_rank * m->BTs : 0;
    m->seqpos = seq_pos_of_rank(cp, m->grid->cp_rank, T);
    Pipeline *pipe = &m->pipe;
    pipe->pp = &m->grid->pp_group; pipe->tp = &m->grid->tp_group;
    // (without a pipeline GPipe is 1F1B)
    int nslots = pipeline_plan(pipe, pp == 1 ? SCHEDULE_1F1B : schedule, pp, vpp, m->grid->pp_rank, accum);
    int Ld = 0, Lm = 0;
    for (int l = 0; l < Ls; l++) { if (is_moe_layer(c, m->layer_id[l])) { Lm++; } else { Ld++; } }
    moe_set_batch(&m->moe, B, T, cp, Lm > 0, moe_dropless);
    int Lmax = 0, Ldmax = 0;
    int *moe_at = (int *)calloc_check(Ls + 1, sizeof(int));   // some chunk has a MoE layer at this position
    for (int v = 0; v < vpp; v++) {
        int l0 = m->chunk_l0[v], Lc = m->chunk_l0[v + 1] - l0, Ldc = 0;
        for (int l = 0; l < Lc; l++) { if (is_moe_layer(c, m->layer_id[l0 + l])) { moe_at[l] = 1; } else { Ldc++; } }
        if (Lc > Lmax) { Lmax = Lc; }
        if (Ldc > Ldmax) { Ldmax = Ldc; }
    }
    m->acts = (Activations *)malloc_check(nslots * sizeof(Activations));
    for (int i = 0; i < nslots; i++) { slot_alloc(m, &m->acts[i], 0, Lmax, Ldmax, Ld, moe_at); }
    slot_alloc(m, &m->scratch, 1, Ls, Ldmax, Ld, moe_at);
    free(moe_at);
    // mlp: the stored MoE layers compute their experts' hidden rows in the scratch's
    for (int i = 0; i < nslots && m->recompute == RECOMPUTE_MLP; i++) { moe_acts_share_hidden(m->acts[i].moe, Lmax, m->scratch.moe); }
    workspace_alloc(m, chunk, Lm > 0);
    // ZB: the layers' pending W passes (pipeline.h's npending sets of every layer's WGrads)
    m->defer_w = pp > 1 && schedule == SCHEDULE_ZB && Ls > 0;
    if (m->defer_w) {
        size_t elems = 0, floats = 0, f;
        WGrads d;
        for (int l = 0; l < Ls; l++) { elems += wgrads_layout(m, is_moe_layer(c, m->layer_id[l]), NULL, NULL, &d, &f); floats += f; }
        m->wstore.elems = (floatX *)mem_alloc((size_t)pipe->npending * elems * floatx_bytes(), MEM_ACTIVATIONS);
        m->wstore.floats = (float *)mem_alloc((size_t)pipe->npending * floats * sizeof(float), MEM_ACTIVATIONS);
        m->wstore.counts = (int *)calloc_check((size_t)pipe->npending * (Lm + 1) * m->grid->ep * (c->num_experts + 1),
                                               sizeof(int));
    }
    m->fwd_tokens = (int *)malloc_check(sizeof(int) * 2 * m->BT);
    // the pipeline's view of the slots: each one's input (resid[0]) and output (resid[Lc])
    floatX **resid = (floatX **)malloc_check(nslots * sizeof(floatX *));
    int *chunk_len = (int *)malloc_check(vpp * sizeof(int));
    for (int i = 0; i < nslots; i++) { resid[i] = m->acts[i].resid; }
    for (int v = 0; v < vpp; v++) { chunk_len[v] = m->chunk_l0[v + 1] - m->chunk_l0[v]; }
    pipeline_alloc(pipe, m->first, m->last, !m->sp && tp > 1, m->BTs * c->channels, resid, chunk_len, m->ws.dresid,
                   m->zero.prefetch && pp > 1);
}

// The one set-up path: this rank's part of the model from the full weights (params, file order; NULL in a
// plan: the sizes only), then its activations and buffers.
static void gpt2_init(Model *m, const ModelConfig *c, float *params, Grid *grid, const ModelOptions *o) {
    int first[PIPE_MAX_LAYERS + 1];
    char err[256];
    if (layer_split(first, o->pp_layers, c, o->T * grid->cp, grid->pp, o->vpp, err, sizeof(err))) { fail("%s", err); }
    gpt2_build(m, c, params, grid, o->vpp, first, o->zero, o->sp, o->moe, o->muon);
    cp_attention_init(&m->cpring, &grid->cp_group, o->cp_u, m->NHl, m->KVl, m->hs);
    if (o->muon) { muon_init(&m->muon, &m->zero, grid, c, first, o->vpp, o->muon_momentum); }
    if (o->muon && !mem_planning) { comm_report_world = 1; }
    m->recompute = o->recompute;
    m->zero.prefetch = o->overlap;
    gpt2_alloc_activations(m, o->B, o->T, o->ce_chunk, o->accum, o->schedule, o->moe_dropless);
    if (!mem_planning) {   // what the steps use beside the model (a plan counts them itself: gpt2_plan)
#ifdef USE_CUDA
        matmul_setup();
#endif
        if (m->Ls > 0) { cp_attention_setup(&m->cpring, o->B, o->T); }   // (the attention's workspace; the ring's D)
        m->step_tokens = (int *)host_alloc_pinned(sizeof(int) * 2 * o->accum * m->BT);
    }
    m->guard.loss_limit = 2.0f * logf((float)c->vocab_size);   // the fixed bound; the run adds -sl / -sg's
    m->guard.norm_limit = INFINITY;
}

// The model's host memory (its device buffers are the allocator's: alloc.h frees them at the end of a
// run, and a plan allocates none).
static void gpt2_free(Model *m) {
    int Lmax = 0;
    for (int v = 0; v < m->vpp; v++) { if (m->chunk_l0[v + 1] - m->chunk_l0[v] > Lmax) { Lmax = m->chunk_l0[v + 1] - m->chunk_l0[v]; } }
    for (int i = 0; i <= m->pipe.nslots; i++) {   // the slots, then the scratch
        Activations *acts = i < m->pipe.nslots ? &m->acts[i] : &m->scratch;
        for (int l = 0; acts->moe && l <= (i < m->pipe.nslots ? Lmax : m->Ls); l++) { free(acts->moe[l].counts); }
        free(acts->moe);
    }
    pipeline_free(&m->pipe);
    zero_free(&m->zero);
    free(m->units); free(m->u_layer); free(m->u_experts); free(m->layer_id); free(m->chunk_l0); free(m->acts);
    free(m->costs.layer); free(m->wstore.counts); free(m->moe.shape.layer_index);
    free(m->fwd_tokens);
}

// The tied embedding's gradient. wte is used twice: by the token embedding (first stage, the first op
// of the forward, so the last of the backward) and by the LM head (last stage, the first op of the
// backward). Both add to the gradient of the wte unit of their stage, so the unit is opened by the
// first user of a backward and closed by the last (zero.h reduces it once closed):
//   no pipeline: one unit [wpe, wte]; the head opens it, the token embedding adds its part and closes it.
//   pipeline:    each end stage holds its own copy of the wte unit: the head opens and closes the last
//                stage's, the token embedding the first stage's (and the separate wpe unit); after the
//                data-parallel reduction zero_finish_grads sums the two copies over the emb group.
// An untied LM head (Llama's head) is a unit of its own on the last stage, opened and closed by the head alone.
typedef enum { WTE_HEAD, WTE_EMBEDDING } WteUser;

static int head_unit(const Model *m) { return m->u_head >= 0 ? m->u_head : m->u_embed; }   // the LM head's unit,
static int head_tensor(const Model *m) { return m->u_head >= 0 ? T_HEAD : T_WTE; }          // its weight

static floatX *wte_grad_open(Model *m, WteUser user) {
    int shared = m->first && m->last && m->u_head < 0;   // one stage holds both users: the head opened it
    if (user == WTE_EMBEDDING && shared) { return zero_unit_grads(&m->zero, m->u_embed); }
    return zero_begin_unit_backward(&m->zero, user == WTE_HEAD ? head_unit(m) : m->u_embed);
}

static void wte_grad_close(Model *m, WteUser user, int last_micro) {
    int shared = m->first && m->last && m->u_head < 0;
    if (user == WTE_HEAD && shared) { return; }   // the token embedding still adds to it
    zero_end_unit_backward(&m->zero, user == WTE_HEAD ? head_unit(m) : m->u_embed, last_micro);
}

// The stage's layer l's number among the stage's MoE layers (in the stage's order: moe_forward's layer), l a MoE layer.
static int moe_layer_number(const Model *m, int l) {
    int n = 0;
    for (int i = 0; i < l; i++) { n += m->u_experts[i] >= 0; }
    return n;
}

// One layer: y.res (BTs, C) -> y.out, its activations into y. Tensor-parallel communication by the two
// operations of tensor_parallel.h; ZeRO-3 gathers the layer's parameters (and its experts') as they come.
static void layer_forward(Model *m, LayerActs y, int l) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp, ue = m->u_experts[l];
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS] = {}, *x;   // (a tensor the unit lacks stays NULL)
    int v = layer_chunk(m, l), u = m->u_layer[l];   // what runs next: the chunk's next layer, or the final LayerNorm
    int next = l + 1 < m->chunk_l0[v + 1] ? m->u_layer[l + 1] : (m->last && v == m->vpp - 1 ? m->u_final : -1);
    unit_view(&m->units[u], zero_unit_params(&m->zero, u), p);
    // ZeRO-3: the next unit, while this one computes
    if (!m->recomputing) {
        zero_prefetch_params(&m->zero, ue >= 0 ? ue : next, u);
    }
    // attention block: ln1 -> all tokens -> qkv (column-parallel, local heads; Llama: RoPE on q and k at the
    //                  tokens' positions in their sequences) -> attention -> attproj (row-parallel) -> sum partials
    float eps = m->config.norm_eps;
    norm_forward(m->rms, y.ln1, y.ln1_mean, y.ln1_rstd, y.res, p[T_LN1W], p[T_LN1B], eps, BTs, C);
    x = tp_all_tokens(tp, sp, y.ln1, w->xfull, BTs, C);
    matmul_forward(y.qkv, x, p[T_QKVW], p[T_QKVB], BT, C, m->QKVl);
    if (m->QKn) {
        qk_norm_forward(tp, y.qkv, y.qkraw, y.qkrstd, w->qkss, p[T_QNORMW], p[T_KNORMW], eps, BT, NHl * m->hs,
                        m->KVl * m->hs, m->QKVl);
    }
    if (m->rope) { rope_forward(y.qkv, m->rope, m->seqpos, B, T, NHl, m->KVl, m->hs); }
    if (m->grid->cp > 1) { cp_attention_forward(&m->cpring, y.atty, y.lse, y.qkv, B, T, NHl, m->KVl, m->hs); }   // ring attention
    else { attention_forward(y.atty, y.lse, y.qkv, B, T, NHl, m->KVl, m->hs); }
    matmul_forward(w->pfull, y.atty, p[T_ATTPROJW], NULL, BT, Cl, C);
    x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    // MLP block: (+ bias + residual, fused with) ln2 -> all tokens -> fc (column-parallel, fused with GELU; Llama:
    // gate and up, then SwiGLU) -> fcproj (row-parallel) -> sum partials; a MoE layer: the experts instead
    residual_norm_forward(m->rms, y.mid, y.ln2, y.ln2_mean, y.ln2_rstd, y.res, x, p[T_ATTPROJB], p[T_LN2W], p[T_LN2B],
                          eps, BTs, C);
    x = tp_all_tokens(tp, sp, y.ln2, w->xfull, BTs, C);
    if (ue >= 0) {
        floatX *pe[NUM_TENSORS] = {};
        unit_view(&m->units[ue], zero_unit_params(&m->zero, ue), pe);
        moe_forward(&m->moe, y.moe, expert_tensors(p, pe), x, w->pfull, moe_layer_number(m, l), m->micro, !m->recomputing);
        // (over the layer's own unit: done with it)
        if (!m->recomputing) {
            zero_prefetch_params(&m->zero, next, ue);
        }
    } else {
        mlp_fc_forward(m->swiglu, y.fchg, y.fch, x, p[T_FCW], p[T_FCB], BT, C, m->Fl);
        matmul_forward(w->pfull, y.fchg, p[T_FCPROJW], NULL, BT, m->Fl, C);
    }
    x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    residual_bias_forward(y.out, y.mid, x, ue >= 0 ? NULL : p[T_FCPROJB], BTs, C);
}

// Model chunk v of the stage (the stage's layers without interleaving), a: a slot of that chunk.
// The input (B, T) tokens on the first stage's chunk 0, a->resid[0] received from the previous stage
// otherwise -> the chunk's output a->resid[Lc] (the last stage's last chunk: the final LayerNorm a->lnf).
static void gpt2_forward(Model *m, int v, Activations *acts) {
    int C = m->config.channels, T = m->T, BT = m->BT, BTs = m->BTs, sp = m->sp;
    int l0 = m->chunk_l0[v], l1 = m->chunk_l0[v + 1];
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS] = {}, *x;   // (a tensor the model lacks stays NULL)

    if (m->first && v == 0) {
        // embedding: vocab-parallel token lookup of all BT tokens, summed over tp (SP: reduce-scattered
        // along the tokens), then (GPT-2) the position embedding of the local tokens
        Span s = model_span(m, SPAN_SAME_LAYER, "embedding", "forward");
        unit_view(&m->units[m->u_embed], zero_unit_params(&m->zero, m->u_embed), p);
        if (m->u_pos >= 0) { unit_view(&m->units[m->u_pos], zero_unit_params(&m->zero, m->u_pos), p); }   // (the same unit without a pipeline)
        embedding_forward(w->pfull, acts->inputs, p[T_WTE], m->v0, m->v0 + m->Vl, BT, C);
        x = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
        copy_on_device(acts->resid, x, (size_t)BTs * C * sizeof(floatX));
        if (p[T_WPE]) { position_forward(acts->resid, p[T_WPE], m->seqpos, m->tok0, BTs, T, C); }
        span_close(s, &m->costs.embed, "\"micro\":%d", m->micro);
    }
    for (int l = l0; l < l1; l++) {
        Span s = model_span(m, m->layer_id[l], m->u_experts[l] >= 0 ? "MoE layer" : "layer", "forward");
        layer_forward(m, layer_acts(m, acts, l), l);
        span_close(s, &m->costs.layer[l], "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
    }
    if (m->last && v == m->vpp - 1) {
        Span s = model_span(m, SPAN_SAME_LAYER, NULL, NULL);
        unit_view(&m->units[m->u_final], zero_unit_params(&m->zero, m->u_final), p);
        norm_forward(m->rms, acts->lnf, acts->lnf_mean, acts->lnf_rstd, acts->resid + (size_t)(l1 - l0) * BTs * C,
                     p[T_LNFW], p[T_LNFB], m->config.norm_eps, BTs, C);
        span_close(s, &m->costs.head, NULL);
    }
}

// Last stage: the LM head (tied: wte) and the loss, fused and chunked (fused_ce.h). The sum of the losses of
// this rank's B*T tokens is added to ws.loss_sum on the device (read once, by gpt2_read_loss). With
// backward: also the head's weight gradient and the gradient of lnf (acts->dlnf).
static void gpt2_head(Model *m, Activations *acts, float dloss, int backward, int last_micro) {
    const ModelConfig *c = &m->config;
    int C = c->channels, BT = m->BT;
    Group *tp = &m->grid->tp_group;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS], *g[NUM_TENSORS];
    Span s = model_span(m, FL_LAYER_HEAD, "head + loss", backward ? "forward+backward" : "forward");
    // every tp rank needs the hidden states of all tokens: it holds Vp/tp of the vocabulary
    floatX *h = tp_all_tokens(tp, m->sp, acts->lnf, w->xfull, m->BTs, C);
    int u = head_unit(m), id = head_tensor(m);
    unit_view(&m->units[u], zero_unit_params(&m->zero, u), p);
    floatX *dh = NULL, *dwte = NULL;
    if (backward) {
        unit_view(&m->units[u], wte_grad_open(m, WTE_HEAD), g);
        dwte = g[id];
        dh = w->pfull;
    }
    fused_classifier(w->losses, dh, dwte, h, p[id], acts->targets, &m->ce, tp, m->v0, c->vocab_size, m->Vl, BT, C,
                     dloss);
    if (backward) {
        floatX *dlnf = tp_sum_partials(tp, m->sp, dh, w->tokbuf, m->BTs, C);
        copy_on_device(acts->dlnf, dlnf, (size_t)m->BTs * C * sizeof(floatX));
        wte_grad_close(m, WTE_HEAD, last_micro);
    }
    loss_accumulate(w->loss_sum, w->losses, BT);
    span_close(s, backward ? &m->costs.head : NULL, "\"micro\":%d", m->micro);
}

// The loss sum starts at 0 (a step's or an evaluation's first batch).
static void gpt2_clear_loss(Model *m) {
    if (m->last) { memset_zero_device(m->ws.loss_sum, sizeof(double)); }
}

// The mean loss of `batches` batches of this rank's B*T tokens whose sums gpt2_head accumulated on the
// last stage since gpt2_clear_loss (a wait on the device), on every rank: broadcast from the last stage,
// summed over the ranks sharing the step's tokens. (A training step reads its loss with its norm, in
// gpt2_update; this is for evaluations and tests.)
static float gpt2_read_loss(Model *m, int batches) {
    double sum = 0.0;
    if (m->last) { copy_to_host(&sum, m->ws.loss_sum, sizeof(double)); }
    double loss = sum / ((double)m->BT * batches);
    comm_host_bcast(&m->grid->pp_group, &loss, 1, DT_DOUBLE, m->grid->pp - 1, "broadcast of the loss");
    comm_host_all_reduce(m->grid->grad_group, &loss, 1, DT_DOUBLE, HOST_SUM, "all-reduce of the loss");
    return (float)(loss / (m->grid->dp * m->grid->cp));
}

// Micro-batch i's WGrads for the stage's layer l (ZB), in set i % npending of the W store; 0 without ZB.
static int layer_wgrads(const Model *m, int i, int l, WGrads *d) {
    const ModelConfig *c = &m->config;
    if (!m->defer_w) { return 0; }
    size_t set = 0, set_f = 0, off = 0, off_f = 0, e, f;
    int moe_before = 0, Lm = 0, j = i % m->pipe.npending;
    for (int k = 0; k < m->Ls; k++) {   // (the stage's layers' WGrads one after another: l's offset in a set)
        int km = is_moe_layer(c, m->layer_id[k]);
        e = wgrads_layout(m, km, NULL, NULL, d, &f);
        set += e; set_f += f; Lm += km;
        if (k < l) { off += e; off_f += f; moe_before += km; }
    }
    int moe = is_moe_layer(c, m->layer_id[l]);
    wgrads_layout(m, moe, m->wstore.elems + j * set + off, m->wstore.floats + j * set_f + off_f, d, &f);
    if (moe) {
        d->moe.counts = m->wstore.counts + ((size_t)j * (Lm + 1) + moe_before) * m->grid->ep * (c->num_experts + 1);
    }
    return 1;
}

// ZB: where layer l's recomputed activations go so that its W pass finds them (B's recomputation writes them
// there): the GELU output (recompute mlp, full; a MoE layer's rows and shared experts') and under full ln1, ln2
// and the attention output (without SP ln1 and ln2 are already all the tokens: kept where B's gather would have
// put them).
static void wgrads_acts(const Model *m, WGrads *d, LayerActs *y) {
    if (d->fchg) { y->fchg = d->fchg; }
    if (d->moe.dye) {   // a MoE layer: its MoEActs, with the recomputed rows where W finds them
        d->acts = *y->moe;
        if (d->hg) { d->acts.hg = d->hg; }
        if (d->shg) { d->acts.shg = d->shg; }
        if (d->xe) { d->acts.xe = d->xe; }
        y->moe = &d->acts;
    }
    if (d->atty) {
        y->atty = d->atty;
        if (!(m->sp && m->grid->tp > 1)) { y->ln1 = d->xln1; y->ln2 = d->xln2; }
    }
}

// dy of all tokens (tp_all_tokens' result) kept in dst for the W pass: gathered there already (SP), or copied.
static floatX *keep_for_w(floatX *dst, floatX *dy, size_t n) {
    if (dy != dst) { copy_on_device(dst, dy, n * sizeof(floatX)); }
    return dst;
}

// One layer's backward: w->dresid, the gradient of y.out, becomes the gradient of y.res; the layer's
// parameter gradients (and its experts') go to zero.h as the layer is done. ZB (d not NULL): B only, the
// gradient of y.res; what the weights' gradients need is kept in d for layer_backward_weights.
static void layer_backward(Model *m, LayerActs y, const WGrads *d, int l, int last_micro) {
    int C = m->config.channels, B = m->B, T = m->T, BT = m->BT, BTs = m->BTs;
    int Cl = m->Cl, NHl = m->NHl, sp = m->sp, u = m->u_layer[l], ue = m->u_experts[l];
    Group *tp = &m->grid->tp_group;
    Zero *z = &m->zero;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS] = {}, *g[NUM_TENSORS] = {}, *dy, *x;   // (a tensor the unit lacks stays NULL; ZB: no g)
    int prev = l > m->chunk_l0[layer_chunk(m, l)] ? m->u_layer[l - 1] : -1;   // the chunk's layer below
    unit_view(&m->units[u], zero_unit_params(z, u), p);
    if (ue < 0) { zero_prefetch_params(z, prev, u); }   // ZeRO-3: the layer below, while this one computes
    if (!d) { unit_view(&m->units[u], zero_begin_unit_backward(z, u), g); }
    else {   // (the LayerNorms' parameter gradients of this micro-batch, for W to add)
        memset_zero_device(d->lnp, ((size_t)4 * C + m->QKn) * sizeof(floatX));
        g[T_LN2W] = d->lnp; g[T_LN2B] = d->lnp + C; g[T_LN1W] = d->lnp + 2 * C; g[T_LN1B] = d->lnp + 3 * C;
    }
    // MLP block (w->dresid is the gradient of the layer's output)
    x = tp_all_tokens(tp, sp, y.ln2, d && d->xln2 ? d->xln2 : w->xfull, BTs, C);   // SP: gathered again, not stored
    if (ue >= 0) {   // the experts, then the router
        floatX *pe[NUM_TENSORS] = {}, *ge[NUM_TENSORS] = {};
        unit_view(&m->units[ue], zero_unit_params(z, ue), pe);
        if (!d) { unit_view(&m->units[ue], zero_begin_unit_backward(z, ue), ge); }
        dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        moe_backward(&m->moe, y.moe, expert_tensors(p, pe), expert_tensors(g, ge), x, dy, w->pfull,
                     m->recompute == RECOMPUTE_MLP, d ? &d->moe : NULL);
        if (!d) { zero_end_unit_backward(z, ue, last_micro); }
        zero_prefetch_params(z, prev, u);   // (over the experts: done with them)
    } else {
        if (m->recompute == RECOMPUTE_MLP) { mlp_fc_forward(m->swiglu, y.fchg, y.fch, x, p[T_FCW], p[T_FCB], BT, C, m->Fl); }
        if (!d) { bias_backward(g[T_FCPROJB], w->dresid, BTs, C); }
        dy = tp_all_tokens(tp, sp, w->dresid, d ? d->dfcproj : w->pfull, BTs, C);
        if (d) { dy = keep_for_w(d->dfcproj, dy, (size_t)BT * C); }
        floatX *dfc = d ? d->dfc : w->dwide;   // d(fc output)
        mlp_proj_backward(m->swiglu, dfc, g[T_FCPROJW], dy, y.fchg, p[T_FCPROJW], y.fch, w->dact, BT, m->Fl, C);
        matmul_backward(w->pfull, g[T_FCW], g[T_FCB], dfc, x, p[T_FCW], BT, C, m->FCl);
    }
    floatX *dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    norm_backward(m->rms, w->dresid, g[T_LN2W], g[T_LN2B], dln, y.mid, p[T_LN2W], y.ln2_mean, y.ln2_rstd, BTs, C);
    // attention block (w->dresid is now the gradient of mid)
    if (!d) { bias_backward(g[T_ATTPROJB], w->dresid, BTs, C); }
    dy = tp_all_tokens(tp, sp, w->dresid, d ? d->dattproj : w->pfull, BTs, C);
    if (d) { dy = keep_for_w(d->dattproj, dy, (size_t)BT * C); }
    matmul_backward(w->datty, g[T_ATTPROJW], NULL, dy, y.atty, p[T_ATTPROJW], BT, Cl, C);
    floatX *dqkv = d ? d->dqkv : w->dwide;
    if (m->grid->cp > 1) { cp_attention_backward(&m->cpring, dqkv, w->datty, y.qkv, y.atty, y.lse, B, T, NHl, m->KVl, m->hs); }
    else { attention_backward(dqkv, w->datty, y.qkv, y.atty, y.lse, B, T, NHl, m->KVl, m->hs); }
    if (m->rope) { rope_backward(dqkv, m->rope, m->seqpos, B, T, NHl, m->KVl, m->hs); }   // (dq, dk before RoPE)
    if (m->QKn) {   // (ZB: the norms' weight gradients kept in lnp after ln1's, for W to add)
        floatX *dwq = d ? d->lnp + 4 * C : g[T_QNORMW], *dwk = d ? d->lnp + 4 * C + NHl * m->hs : g[T_KNORMW];
        qk_norm_backward(tp, dqkv, dwq, dwk, y.qkraw, y.qkrstd, w->qkss, p[T_QNORMW], p[T_KNORMW], BT, NHl * m->hs,
                         m->KVl * m->hs, m->QKVl);
    }
    x = tp_all_tokens(tp, sp, y.ln1, d && d->xln1 ? d->xln1 : w->xfull, BTs, C);
    matmul_backward(w->pfull, g[T_QKVW], g[T_QKVB], dqkv, x, p[T_QKVW], BT, C, m->QKVl);
    dln = tp_sum_partials(tp, sp, w->pfull, w->tokbuf, BTs, C);
    norm_backward(m->rms, w->dresid, g[T_LN1W], g[T_LN1B], dln, y.res, p[T_LN1W], y.ln1_mean, y.ln1_rstd, BTs, C);
    if (!d) { zero_end_unit_backward(z, u, last_micro); }
}

// ZB: one layer's W pass, the gradients of its weights (a MoE layer's: and its experts') from what its B kept in
// d and the activations still in the slot. The same products into the same gradients as layer_backward's, so the same sums; no
// parameter is read (ZeRO-3 gathers nothing for W).
static void layer_backward_weights(Model *m, LayerActs y, const WGrads *d, int l, int last_micro) {
    int C = m->config.channels, BT = m->BT, BTs = m->BTs, Cl = m->Cl, u = m->u_layer[l];
    floatX *g[NUM_TENSORS] = {};
    size_t own = (size_t)m->tok0 * C;   // the local tokens' rows of an all-token gradient (SP; 0 otherwise)
    unit_view(&m->units[u], zero_begin_unit_backward(&m->zero, u), g);
    if (d->moe.dye) {   // a MoE layer: the experts' (their own unit), the shared experts' and the router's
        int ue = m->u_experts[l];
        floatX *ge[NUM_TENSORS] = {};
        unit_view(&m->units[ue], zero_begin_unit_backward(&m->zero, ue), ge);
        moe_backward_weights(&m->moe, y.moe, &d->moe, expert_tensors(g, ge), d->xln2 ? d->xln2 : y.ln2);
        zero_end_unit_backward(&m->zero, ue, last_micro);
    } else {
        bias_backward(g[T_FCPROJB], d->dfcproj + own, BTs, C);
        matmul_backward(NULL, g[T_FCPROJW], NULL, d->dfcproj, y.fchg, NULL, BT, m->Fl, C);
        matmul_backward(NULL, g[T_FCW], g[T_FCB], d->dfc, d->xln2 ? d->xln2 : y.ln2, NULL, BT, C, m->FCl);
    }
    accumulate(g[T_LN2W], d->lnp, C);            // (the LayerNorms' parameter gradients B computed)
    accumulate(g[T_LN2B], d->lnp + C, C);
    bias_backward(g[T_ATTPROJB], d->dattproj + own, BTs, C);
    matmul_backward(NULL, g[T_ATTPROJW], NULL, d->dattproj, y.atty, NULL, BT, Cl, C);
    matmul_backward(NULL, g[T_QKVW], g[T_QKVB], d->dqkv, d->xln1 ? d->xln1 : y.ln1, NULL, BT, C, m->QKVl);
    accumulate(g[T_LN1W], d->lnp + 2 * C, C);
    accumulate(g[T_LN1B], d->lnp + 3 * C, C);
    if (m->QKn) { accumulate(g[T_QNORMW], d->lnp + 4 * C, m->NHl * m->hs); }
    if (m->QKn) { accumulate(g[T_KNORMW], d->lnp + 4 * C + m->NHl * m->hs, m->KVl * m->hs); }
    zero_end_unit_backward(&m->zero, u, last_micro);
}

// The backward of one micro-batch through model chunk v: from a->dlnf on the last stage's last chunk,
// from the gradient of the chunk's output (in ws.dresid) otherwise; leaves the gradient of the chunk's
// input in ws.dresid. Each unit's gradient goes to zero.h as soon as the unit is done, so its
// data-parallel reduction overlaps the backward of the layers below.
static void gpt2_backward(Model *m, int v, Activations *acts, int last_micro) {
    int C = m->config.channels, T = m->T, BT = m->BT, BTs = m->BTs, sp = m->sp;
    int l0 = m->chunk_l0[v], l1 = m->chunk_l0[v + 1];
    Group *tp = &m->grid->tp_group;
    Zero *z = &m->zero;
    Workspace *w = &m->ws;
    floatX *p[NUM_TENSORS] = {}, *g[NUM_TENSORS] = {};   // (a tensor the model lacks stays NULL)

    if (m->last && v == m->vpp - 1) {
        Span s = model_span(m, SPAN_SAME_LAYER, NULL, NULL);
        unit_view(&m->units[m->u_final], zero_unit_params(z, m->u_final), p);
        if (l1 > l0) { zero_prefetch_params(z, m->u_layer[l1 - 1], m->u_final); }
        unit_view(&m->units[m->u_final], zero_begin_unit_backward(z, m->u_final), g);
        memset_zero_device(w->dresid, (size_t)BTs * C * sizeof(floatX));
        norm_backward(m->rms, w->dresid, g[T_LNFW], g[T_LNFB], acts->dlnf, acts->resid + (size_t)(l1 - l0) * BTs * C,
                      p[T_LNFW], acts->lnf_mean, acts->lnf_rstd, BTs, C);
        zero_end_unit_backward(z, m->u_final, last_micro);
        span_close(s, &m->costs.head, NULL);
    }
    for (int l = l1 - 1; l >= l0; l--) {
        Span s = model_span(m, m->layer_id[l], NULL, NULL);
        LayerActs y = layer_acts(m, acts, l);
        WGrads d;
        int defer = layer_wgrads(m, m->micro, l, &d);   // ZB: B only, W later (gpt2_backward_weights)
        if (defer) { wgrads_acts(m, &d, &y); }          // (what is recomputed, where W finds it)
        if (m->recompute == RECOMPUTE_FULL) {   // the layer's activations again, from its stored input
            Span r = span_open(SPAN_SAME_LAYER, 0, "recompute", "forward");
            m->recomputing = 1;
            layer_forward(m, y, l);
            m->recomputing = 0;
            span_close(r, NULL, "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
        }
        const char *name = m->u_experts[l] >= 0 ? "MoE layer" : defer ? "layer B" : "layer";
        Span b = span_open(SPAN_SAME_LAYER, 0, name, "backward");
        layer_backward(m, y, defer ? &d : NULL, l, last_micro);
        span_close(b, NULL, "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
        span_close(s, &m->costs.layer[l], NULL);
    }
    if (m->first && v == 0) {
        Span s = model_span(m, FL_LAYER_EMBEDDING, "embedding", "backward");
        // the embedding: the position embedding of the local tokens, the token embedding of all of them
        int pipeline = m->u_pos >= 0 && m->u_pos != m->u_embed;   // (GPT-2's wpe a unit of its own)
        unit_view(&m->units[m->u_embed], wte_grad_open(m, WTE_EMBEDDING), g);
        if (pipeline) { unit_view(&m->units[m->u_pos], zero_begin_unit_backward(z, m->u_pos), g); }
        if (g[T_WPE]) { position_backward(g[T_WPE], w->dresid, m->seqpos, m->tok0, BTs, T, C); }
        floatX *dy = tp_all_tokens(tp, sp, w->dresid, w->pfull, BTs, C);
        embedding_backward(g[T_WTE], dy, acts->inputs, m->v0, m->v0 + m->Vl, m->config.pad_token, BT, C);   // (padding_idx)
        if (pipeline) { zero_end_unit_backward(z, m->u_pos, last_micro); }
        wte_grad_close(m, WTE_EMBEDDING, last_micro);
        span_close(s, &m->costs.embed, "\"micro\":%d", m->micro);
    }
}

// ZB: the W pass of one micro-batch through model chunk v: the weight gradients of the layers whose B kept
// them for later (layer_wgrads), in the backward's order; a's activations are still in its slot.
static void gpt2_backward_weights(Model *m, int v, Activations *acts, int last_micro) {
    for (int l = m->chunk_l0[v + 1] - 1; l >= m->chunk_l0[v]; l--) {
        WGrads d;
        if (!layer_wgrads(m, m->micro, l, &d)) { continue; }
        Span s = model_span(m, m->layer_id[l], NULL, NULL);
        LayerActs y = layer_acts(m, acts, l);
        wgrads_acts(m, &d, &y);
        Span w = span_open(SPAN_SAME_LAYER, 0, "layer W", "weights");
        layer_backward_weights(m, y, &d, l, last_micro);
        span_close(w, NULL, "\"layer\":%d,\"micro\":%d", m->layer_id[l], m->micro);
        span_close(s, &m->costs.layer[l], NULL);
    }
}

// ----------------------------------------------------------------------------
// one training step: the micro-batches through the pipeline stages (pipeline.h), then AdamW

typedef struct { float beta1, beta2, eps, weight_decay, grad_clip; unsigned int seed; } OptConfig;

// This rank's tokens of a (B, T*cp) batch: each sequence's tokens at the local positions (seq_pos).
static void local_tokens(const Model *m, int *local, const int *batch) {
    int T = m->T, Tg = T * m->grid->cp;
    for (int b = 0; b < m->B; b++) {
        for (int t = 0; t < T; t++) { local[b * T + t] = batch[(size_t)b * Tg + seq_pos(m->seqpos, t)]; }
    }
}

// Micro-batch i's activations in model chunk v.
static Activations *chunk_acts(Model *m, int v, int i) { return &m->acts[m->pipe.slot_of[v * m->pipe.micro + i]]; }

// Micro-batch i's tokens go to chunk 0 (the embedding), its targets to the last chunk (the loss), each
// when that chunk's forward starts (a slot of the last chunk may still hold an earlier micro-batch
// whose forward is yet to come). NULL: not now.
// The copies are queued (copy_to_device_async): the host arrays must hold until the device has run them.
static void gpt2_upload_batch(Model *m, int i, const int *inputs, const int *targets) {
    if (inputs && m->first) { copy_to_device_async(chunk_acts(m, 0, i)->inputs, inputs, sizeof(int) * m->BT); }
    if (targets && m->last) {
        copy_to_device_async(chunk_acts(m, m->vpp - 1, i)->targets, targets, sizeof(int) * m->BT);
    }
}

// What the schedule runs for one training step on this stage.
typedef struct {
    Model *m;
    int accum;
    int *inputs, *targets;   // (accum, BT) the step's batches, read by every stage in the same order
    float dloss;       // d(loss)/d(each token's loss): 1 / (tokens in the global batch)
} TrainStep;

// Forward of micro-batch i through chunk v (its input received); the last chunk of the last stage
// runs the fused head too, forward and backward at once.
static void train_forward(void *ctx, int v, int i) {
    TrainStep *s = (TrainStep *)ctx;
    Model *m = s->m;
    Activations *acts = chunk_acts(m, v, i);
    m->micro = i;
    flight_at(PH_FORWARD, i, FL_LAYER_EMBEDDING);
    gpt2_upload_batch(m, i, v == 0 ? s->inputs + (size_t)i * m->BT : NULL,
                      v == m->vpp - 1 ? s->targets + (size_t)i * m->BT : NULL);
    gpt2_forward(m, v, acts);
    if (m->last && v == m->vpp - 1) { gpt2_head(m, acts, s->dloss, 1, i == s->accum - 1); }
}

static void train_backward(void *ctx, int v, int i) {
    TrainStep *s = (TrainStep *)ctx;
    s->m->micro = i;
    flight_at(PH_BACKWARD, i, FL_LAYER_HEAD);
    gpt2_backward(s->m, v, chunk_acts(s->m, v, i), i == s->accum - 1);
}

static void train_weights(void *ctx, int v, int i) {
    TrainStep *s = (TrainStep *)ctx;
    s->m->micro = i;
    flight_at(PH_WEIGHTS, i, FL_LAYER_NONE);
    gpt2_backward_weights(s->m, v, chunk_acts(s->m, v, i), i == s->accum - 1);
}

// Forward and backward of `accum` micro-batches (the number the activations were allocated for); the
// gradients end up reduced as the ZeRO stage wants them, the losses summed on the device. Nothing waits
// for the device here: gpt2_update reads the loss with the norm (or gpt2_read_loss, for a test).
static void gpt2_forward_backward(Model *m, DataLoader *dl, int accum) {
    mem_poison_scratch();   // (the emulated device only: what this step reads before writing shows as NaN)
    zero_clear_grads(&m->zero);
    gpt2_clear_loss(m);
    // the MoE auxiliary losses' seeds (moe.h): aux is a mean over the global batch's sequences, z over its tokens
    double sequences = (double)m->B * accum * m->grid->dp;
    double Tg = (double)m->T * m->grid->cp;   // a whole sequence's tokens
    moe_step_begin(&m->moe, (float)(m->moe.shape.opt.aux_coeff * m->config.num_experts / (Tg * sequences)),
                   (float)(m->moe.shape.opt.z_coeff / (Tg * sequences)));
    int ranks = m->grid->dp * m->grid->cp;   // the ranks that share a step's tokens (cp: each sequence too)
    if (accum != m->pipe.steps.n_total / m->vpp) {
        fail("%d micro-batches, the schedule was made for %d: a bug", accum, m->pipe.steps.n_total / m->vpp);
    }
    device_synchronize();   // the previous step's uploads have read the buffer (the step ended with a wait: free here)
    TrainStep s = {m, accum, m->step_tokens, m->step_tokens + (size_t)accum * m->BT,
                   1.0f / ((float)m->BT * accum * ranks)};
    for (int i = 0; i < accum; i++) {
        dataloader_next_batch(dl);
        local_tokens(m, s.inputs + (size_t)i * m->BT, dl->inputs);
        local_tokens(m, s.targets + (size_t)i * m->BT, dl->targets);
    }
    m->costs.in_step = 1;
    pipeline_run(&m->pipe, (StageWork){&s, train_forward, train_backward, train_weights});
    m->costs.in_step = 0;
    m->costs.micro_batches += accum;
    m->moe.stats.count_stats = 0;
    zero_finish_grads(&m->zero);
}

// the step's mean loss (global batch), its gradient norm before clipping
typedef struct { float loss, norm; int why; } StepResult;   // why: SKIP_NONE, or why the update was skipped

// Clips by the global gradient norm and runs AdamW (step is 0-based), all on the device: the norm's
// partial sums and this rank's loss sum (the last stage's tp rank 0: the other tp ranks hold copies)
// all-reduced over the world in one call, the clip scale made from them, AdamW scaled by it. A
// non-finite loss or gradient norm (the same on every rank: both are global) makes the scale 0 and
// skips the update: the parameters and the AdamW state stay as they were, and AdamW's step count t
// counts only the updates applied. Then the step's one wait: the host reads the loss and the norm
// (m->guard.skips_in_a_row says whether this update was skipped).
static StepResult gpt2_update(Model *m, const OptConfig *o, float lr, int step) {
    Zero *z = &m->zero;
    Grid *grid = m->grid;
    flight_at(PH_OPTIMIZER, -1, FL_LAYER_NONE);
    Span s = span_open(SPAN_SAME_LAYER, 0, "norm + AdamW", "optimizer");
    int nparts = zero_grad_norm_parts(z);
    step_stats_gather(z->stats, z->norm_parts, nparts, m->last && grid->tp_rank == 0 ? m->ws.loss_sum : NULL);
    comm_all_reduce(&grid->world, z->stats, 2, DT_DOUBLE, NULL);   // loss_sum, norm_sq
    double tokens = (double)m->BT * (m->pipe.steps.n_total / m->vpp) * grid->dp * grid->cp;   // the global batch's
    step_stats_clip(z->stats, tokens, o->grad_clip, m->guard.loss_limit, m->guard.norm_limit);
    if (m->muon.world) { muon_step(&m->muon, lr, o->weight_decay, &z->stats->scale, o->seed + 7919u * step); }
    zero_optimizer_step(z, lr, o->beta1, o->beta2, o->eps, o->weight_decay, &z->stats->scale, m->guard.updates + 1,
                        o->seed + 7919u * step);
    moe_balance_bias(&m->moe, grid->grad_group, &z->stats->scale);   // loss-free balancing (--moe-bias-rate)
    StepStats st;
    copy_to_host(&st, z->stats, sizeof(st));
    if (st.scale == 0.0f) {
        m->guard.skips++;
        m->guard.skips_in_a_row++;
    } else {
        m->guard.updates++;
        m->guard.skips_in_a_row = 0;
    }
    span_close(s, NULL, "\"step\":%d", step);
    return (StepResult){st.loss, st.norm, (int)st.why};
}

typedef struct { Model *m; const int *inputs, *targets; } ForwardOnly;   // this rank's tokens and targets

static void forward_only(void *ctx, int v, int i) {
    ForwardOnly *f = (ForwardOnly *)ctx;
    gpt2_upload_batch(f->m, i, v == 0 ? f->inputs : NULL, v == f->m->vpp - 1 ? f->targets : NULL);
    gpt2_forward(f->m, v, chunk_acts(f->m, v, i));
}

// Forward only, through every stage: tokens (B, T*cp) in; the last stage's lnf of this rank's tokens
// out (in the last chunk's acts of micro-batch 0).
static void gpt2_forward_pipeline(Model *m, const int *inputs, const int *targets) {
    int *in = m->fwd_tokens, *tg = in + m->BT;
    local_tokens(m, in, inputs);
    local_tokens(m, tg, targets);
    ForwardOnly f = {m, in, tg};
    pipeline_forward_only(&m->pipe, (StageWork){&f, forward_only, NULL, NULL});
}

// Mean loss over up to max_batches batches of the loader (from its start), over all dp ranks.
static float gpt2_validate(Model *m, DataLoader *dl, int max_batches) {
    flight_at(PH_EVAL, 0, FL_LAYER_EMBEDDING);
    dataloader_reset(dl);
    gpt2_clear_loss(m);
    int n = max_batches < (int)dl->nrounds ? max_batches : (int)dl->nrounds;
    if (n < 1) { n = 1; }
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(dl);
        gpt2_forward_pipeline(m, dl->inputs, dl->targets);
        if (m->last) { gpt2_head(m, chunk_acts(m, m->vpp - 1, 0), 0.0f, 0, 0); }
    }
    return gpt2_read_loss(m, n);
}

// ----------------------------------------------------------------------------
// HellaSwag (llmc/hellaswag.h): each example's 4 rows (context + completion) through a forward, each completion
// scored by the mean loss of its tokens, the lowest predicted (the first on a tie). Example e goes to dp rank
// e % dp; a rank's rows fill its micro-batches in order (B need not divide 4), and every rank runs the same number
// of forwards (padding rows are masked). The last stage's ranks hold each local token's loss (tp ranks alike: tp
// rank 0 counts); a cp rank holds its chunks' positions, so the row sums are added over cp. MoE layers run
// dropless, as when sampling: the padding would take capacity. Returns (correct, examples, contexts cut) summed.

// Adds this rank's per-token losses of the batch (the forward and head have run) into sums (B rows): masked.
static void hellaswag_add_losses(Model *m, const int *mask, double *sums, float *host) {
    int T = m->T, Tg = T * m->grid->cp;
    copy_to_host(host, m->ws.losses, sizeof(float) * m->BT);
    for (int b = 0; b < m->B; b++) {
        for (int t = 0; t < T; t++) {
            int p = seq_pos(m->seqpos, t);
            if (mask[(size_t)b * Tg + p]) { sums[b] += host[(size_t)b * T + t]; }
        }
    }
}

static void gpt2_hellaswag(Model *m, const HellaSwag *hs, int counts[3]) {
    Grid *g = m->grid;
    int B = m->B, Tg = m->T * g->cp, per = ceil_div(hs->n, g->dp), nb = ceil_div(HS_ENDINGS * per, B);
    int counting = m->last && g->tp_rank == 0;
    MoEDispatch dispatch = m->moe.dispatch;
    m->moe.dispatch = (MoEDispatch){Tg, 0};   // (dropless: the counted dispatch)
    int *in = (int *)malloc_check(sizeof(int) * 3 * B * Tg), *tg = in + B * Tg, *mask = tg + B * Tg;
    double *score = (double *)calloc_check((size_t)nb * B, sizeof(double));   // each row's masked loss sum
    int *ntok = (int *)calloc_check((size_t)nb * B, sizeof(int));
    float *host = (float *)malloc_check(sizeof(float) * m->BT);
    counts[0] = counts[1] = counts[2] = 0;
    flight_at(PH_EVAL, 0, FL_LAYER_EMBEDDING);
    for (int k = 0; k < nb; k++) {
        for (int b = 0; b < B; b++) {   // row j of this rank: its (j / 4)-th example, completion j % 4
            int j = k * B + b, e = g->dp_rank + g->dp * (j / HS_ENDINGS);
            int *x = in + (size_t)b * Tg, *y = tg + (size_t)b * Tg, *mk = mask + (size_t)b * Tg;
            if (j < HS_ENDINGS * per && e < hs->n) {
                int cut = hellaswag_row(hs, e, j % HS_ENDINGS, Tg, x, y, mk);
                counts[2] += cut && j % HS_ENDINGS == 0 && counting && g->cp_rank == 0;
            } else {
                memset(x, 0, sizeof(int) * Tg); memset(y, 0, sizeof(int) * Tg); memset(mk, 0, sizeof(int) * Tg);
            }
            for (int t = 0; t < Tg; t++) { ntok[j] += mk[t]; }
        }
        gpt2_forward_pipeline(m, in, tg);
        if (m->last) {
            gpt2_head(m, chunk_acts(m, m->vpp - 1, 0), 0.0f, 0, 0);
            if (counting) { hellaswag_add_losses(m, mask, score + (size_t)k * B, host); }
        }
    }
    if (counting && g->cp > 1) {   // (each cp rank summed its positions)
        comm_host_all_reduce(&g->cp_group, score, (size_t)nb * B, DT_DOUBLE, HOST_SUM, "all-reduce (hellaswag)");
    }
    for (int i = 0; counting && g->cp_rank == 0 && i < per; i++) {
        int e = g->dp_rank + g->dp * i, best = 0;
        if (e >= hs->n) { break; }
        double mean[HS_ENDINGS];
        for (int c = 0; c < HS_ENDINGS; c++) {
            int j = HS_ENDINGS * i + c;
            mean[c] = ntok[j] > 0 ? score[j] / ntok[j] : INFINITY;
            if (mean[c] < mean[best]) { best = c; }
        }
        counts[0] += best == hs->label[e];
        counts[1]++;
    }
    comm_host_all_reduce(&g->world, counts, 3, DT_INT, HOST_SUM, "all-reduce (hellaswag)");
    m->moe.dispatch = dispatch;
    free(in); free(score); free(ntok); free(host);
}

// ----------------------------------------------------------------------------
// sampling

// The logits of sequence position pos of the window (row 0), on the last stage's cp rank that holds it, into
// s->logits; returns that rank (cp). The forward has run.
static int position_logits(Model *m, Sampler *s, int pos) {
    int C = m->config.channels, owner, row_t;
    seq_pos_owner(m->grid->cp, m->T, pos, &owner, &row_t);   // position pos's cp rank and its local row there
    floatX *p[NUM_TENSORS];
    if (m->last) { unit_view(&m->units[head_unit(m)], zero_unit_params(&m->zero, head_unit(m)), p); }   // (ZeRO 3: a collective)
    if (m->last && m->grid->cp_rank == owner) {
        floatX *h = tp_all_tokens(&m->grid->tp_group, m->sp, chunk_acts(m, m->vpp - 1, 0)->lnf, m->ws.xfull, m->BTs, C);
        // this rank's vocabulary slice of the logits of position pos, then all slices (Vp)
        matmul_forward(s->row + m->v0, h + (size_t)row_t * C, p[head_tensor(m)], NULL, 1, C, m->Vl);
        comm_all_gather(&m->grid->tp_group, s->row + m->v0, s->row, m->Vl, DT_FLOATX, NULL);
        download_floats(s->logits, s->row, m->config.padded_vocab_size);
    }
    return owner;
}

// Generates n tokens after the prompt (an EOT without one), each from a forward over the window of the
// text's last T*cp tokens (it slides once the text is longer). Every rank runs it with the same generator
// (the forward needs the tp, cp, pp and, at ZeRO 3, dp collectives); the last stage's cp rank holding the
// position draws the token and sends it to the others. Rank 0 prints the text (decoded by tok, or as ids
// after ids_note) and a line "sample ids: ..." of the tokens generated. MoE layers run dropless: with a
// capacity, the padding after the current token would take capacity from it.
static void gpt2_sample(Model *m, Sampler *s, Tokenizer *tok, Rng *rng, const int *prompt, int nprompt, int n, int eot,
                        const char *ids_note) {
    int Tg = m->T * m->grid->cp, len = 0, rank0 = m->grid->rank == 0;
    MoEDispatch dispatch = m->moe.dispatch;
    flight_at(PH_EVAL, 0, FL_LAYER_EMBEDDING);
    m->moe.dispatch = (MoEDispatch){Tg, 0};   // (dropless: the counted dispatch)
    if (nprompt == 0) { s->text[len++] = eot; }
    for (int i = 0; i < nprompt; i++) { s->text[len++] = prompt[i]; }
    if (rank0) {
        printf("generating:%s\n---\n", tok->init_ok ? "" : ids_note);
        for (int i = 0; i < nprompt && tok->init_ok; i++) { safe_printf(tokenizer_decode(tok, prompt[i])); }
    }
    for (int t = 0; t < n && len < s->cap; t++) {
        int w0 = len > Tg ? len - Tg : 0;   // the window: the text's last Tg tokens, then EOT
        for (int i = 0; i < m->B * Tg; i++) { s->window[i] = i < len - w0 ? s->text[w0 + i] : eot; }
        gpt2_forward_pipeline(m, s->window, s->window);
        float coin01 = rng_f32(rng);   // every rank draws, so the generators stay equal
        int owner = position_logits(m, s, len - 1 - w0), next = 0;
        if (m->last && m->grid->cp_rank == owner) { next = sample_token(s, s->logits, m->config.vocab_size, coin01); }
        if (m->last) { comm_host_bcast(&m->grid->cp_group, &next, 1, DT_INT, owner, "broadcast of the sampled token"); }
        comm_host_bcast(&m->grid->pp_group, &next, 1, DT_INT, m->grid->pp - 1, "broadcast of the sampled token");
        s->text[len++] = next;
        if (rank0 && tok->init_ok) {
            safe_printf(tokenizer_decode(tok, next));
            fflush(stdout);
        }
    }
    if (rank0) {   // the text (above, decoded), then the ids generated; or only the ids
        if (tok->init_ok) { printf("\n---\n"); }
        printf("sample ids:");
        for (int i = len - n; i < len; i++) { printf(" %d", s->text[i]); }
        printf(tok->init_ok ? "\n" : "\n---\n");
    }
    m->moe.dispatch = dispatch;
}

// ----------------------------------------------------------------------------
// checkpoints (checkpoint.h): the step counters and the data position beside the units' parameters and
// AdamW state

static TrainState gpt2_train_state(const Model *m, int total_batch, int max_steps, const DataLoader *dl) {
    Grid *grid = m->grid;
    TrainState s = {m->guard.updates, m->guard.skips, m->guard.skips_in_a_row, m->T * grid->cp, total_batch,
                    total_batch / (m->B * m->T * grid->cp * grid->dp), max_steps, dl->fingerprint, m->muon.world != NULL};
    return s;
}

static void save_checkpoint(Model *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch, int async,
                            int max_steps) {
    TrainState s = gpt2_train_state(m, total_batch, max_steps, dl);
    flight_at(PH_CHECKPOINT, -1, FL_LAYER_NONE);
    float *bias = moe_gather_bias(&m->moe, m->grid, num_moe_layers(&m->config));
    checkpoint_save(&m->config, &m->zero, dir, step, &s, dl, rng, async, bias);
    free(bias);
}

// Returns the -x of the run that wrote the checkpoint (0: not recorded).
static int load_state(Model *m, const char *dir, int step, DataLoader *dl, Rng *rng, int total_batch) {
    TrainState s = gpt2_train_state(m, total_batch, 0, dl);
    checkpoint_load(&m->config, &m->zero, dir, step, &s, dl, rng);
    m->guard.updates = s.updates; m->guard.skips = s.skips; m->guard.skips_in_a_row = s.skips_in_a_row;
    return s.max_steps;
}

// The rank's shapes that its step's bytes per group follow from (cost_model.h), as the model set them up.
static CommShape gpt2_comm_shape(const Model *m) {
    const ModelConfig *c = &m->config;
    Grid *grid = m->grid;
    CommShape s = {};
    s.X = floatx_bytes();
    s.tp = grid->tp; s.cp = grid->cp; s.pp = grid->pp; s.sp = m->sp; s.vpp = m->vpp; s.first = m->first; s.last = m->last;
    s.zero = m->zero.stage; s.dp = grid->grad_group->size; s.edp = grid->edp_group.size; s.ep = grid->ep;
    s.B = m->B; s.BT = m->BT; s.BTs = m->BTs; s.C = c->channels; s.Cl = m->Cl; s.Ckv = m->KVl * m->hs; s.Ls = m->Ls;
    s.cp_u = m->cpring.U; s.Ckv_cp = m->cpring.U * m->cpring.Hkv * m->hs;
    s.ce_chunk = m->ce.chunk; s.recompute_full = m->recompute == RECOMPUTE_FULL;
    for (int l = 0; l < m->Ls; l++) { s.nmoe += m->u_experts[l] >= 0; }
    s.moe_layers = m->moe.shape.nlayers; s.topk = c->topk; s.E = c->num_experts; s.El = c->num_experts / grid->ep;
    s.capped = s.nmoe > 0 && m->moe.dispatch.cap < m->T * grid->cp; s.cap = m->moe.dispatch.cap;
    s.padded = s.nmoe > 0 && m->moe.dispatch.padded; s.bias = s.nmoe > 0 && m->moe.shape.opt.bias_rate > 0;
    s.sgate = s.nmoe > 0 && m->moe.shape.shared_gate; s.qknorm = m->QKn > 0;
    s.world = grid->world_size; s.muon_calls = m->muon.world != NULL; s.muon_out = m->muon.out;
    comm_shape_units(&s, c, grid, m->units, m->nunits, m->u_embed, m->u_final, m->u_layer);
    return s;
}

// ----------------------------------------------------------------------------
// the memory plan (plan.h): the model's own set-up with the allocator only counting (alloc.h), on a grid
// without communicators (grid_plan): no weights, no device, one process

// Rank `rank` of a world of `world` ranks: what gpt2_init allocates for the model, then what set-up allocates
// beside it: the sampler's logits row (the last stage, when sampling) and, on CUDA, the cuBLASLt workspace and
// the attention's (cp_attention_workspace_bytes: without cp or with Ulysses the path's at its shape, the ring's
// flash D), which gpt2_init allocates only in a run. The run's other flags (sampling, HellaSwag, the optimizer):
// plan_args.
static const Args *plan_args;
static MemPlan gpt2_plan(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, int rank, PlanBuild b,
                         CommShape *shape) {
    mem_plan_begin(b.floatx);
    Grid grid;
    grid_plan(&grid, world, rank, lay->tp, lay->cp, lay->pp, lay->ep);
    Model m;
    ModelOptions o = model_options(lay, plan_args, moe, grid.dp);
    gpt2_init(&m, c, NULL, &grid, &o);
    if (args_samples(plan_args) && m.last) { mem_alloc((size_t)c->padded_vocab_size * floatx_bytes(), MEM_LOGITS); }
    if (b.cuda) {
        mem_alloc(CUBLASLT_WORKSPACE_BYTES, MEM_WORKSPACE);
        if (m.Ls > 0) {   // (without cp or with Ulysses: the attention's at its shape; the ring's flash blocks: D)
            int path = attention_path_of(lay->attention);
            mem_alloc(cp_attention_workspace_bytes(&m.cpring, path, m.B, m.T, b.floatx), MEM_WORKSPACE);
        }
    }
    MemPlan p = mem_plan_end();
    p.slots = m.pipe.nslots;
    if (shape) { *shape = gpt2_comm_shape(&m); shape->X = (double)b.floatx; }
    gpt2_free(&m);
    return p;
}

// ----------------------------------------------------------------------------
// main: set-up (model, data), the training loop, the reports

// The layout checked against the model, the grid, and the memory plan (before any allocation: the plan,
// and the advice if it does not fit).
static void setup_grid(Args *a, const ModelConfig *c, Grid *grid, int world, int rank) {
    validate_layout(a, c, world, rank);
    comm_one_stream = a->comm_streams == 1;   // (--comm-streams: before the groups make their streams)
    comm_check_collectives = a->check_collectives;
    grid_init(grid, a->layout.tp, a->layout.cp, a->layout.pp, a->layout.ep);
    grid_print(grid);
    check_memory_fits(&a->layout, c, moe_options(a, c), grid, plan_build(a->plan_precision), a->memory_limit, a->machine,
                      a->gpus_per_node);
}

// Everything one training run holds: the flags, the grid and model, the data, the schedule, the log.
typedef struct {
    Args args;
    int rank, world;
    ModelConfig config;
    Grid grid;
    Model model;
    int accum, max_steps, start_step, saved;   // saved: the step of the newest checkpoint this run wrote (-1: none)
    DataLoader train_loader, val_loader;
    int have_val;
    HellaSwag hellaswag;       // --hellaswag's examples (n 0: none)
    Tokenizer tokenizer;
    int eot;
    LRScheduler sched;
    OptConfig opt;
    Rng sample_rng;
    int logf;                  // main.log (rank 0 with -o; -1: none)
    StepTimes times;
    double t_start;            // when the first step started (wall seconds)
    int resumed;               // from a checkpoint
    int sampling;              // args_samples: every -s steps, and at the end
    Sampler sampler;
    int *prompt, nprompt;      // --prompt-ids or --prompt, as tokens
    const char *ids_note;      // what the printed ids are, when there is no tokenizer
    long allocations;          // the device allocations made up to the end of the first step
    Outlier losses, norms;     // the last applied updates' (-sl, -sg: guard.h)
} Run;

// Every rank must hold the same model and read the same data: a hash of the model's shape and weights (the routing
// bias too), and the data's fingerprint (file names, token counts, first tokens), compared with rank 0's.
static void run_agree_on_inputs(Run *r, const float *params) {
    uint64_t mine[2] = {crc32_update(crc32_update(0, &r->config, sizeof(r->config)), params,
                                     model_floats(&r->config) * sizeof(float)), r->train_loader.fingerprint};
    int differ[2], world = r->world;
    comm_host_agree(mine, 2, differ);
    if (differ[0] < world || differ[1] < world) {
        fprintf(stderr, "error: rank %d: the %s on rank %d differs from rank 0's (every rank must read the same files)\n",
                r->rank, differ[0] < world ? "model (-e or the checkpoint)" : "training data (-i: file names, token "
                "counts or first tokens)", differ[0] < world ? differ[0] : differ[1]);
        stop_all(1);
    }
}

// The schedule, the optimizer, and the state of a resumed run (run_setup's)
static void run_setup_schedule(Run *r, int resume_step) {
    Args *a = &r->args;
    int rank = r->rank;
    int steps_per_epoch = (int)(r->train_loader.rounds_per_epoch / r->accum);
    r->max_steps = a->max_steps >= 0 ? a->max_steps : (steps_per_epoch > 0 ? steps_per_epoch : 1);
    r->sched = (LRScheduler){a->scheduler, a->lr, a->final_frac, a->warmup, r->max_steps};
    r->opt = (OptConfig){0.9f, 0.95f, 1e-8f, a->weight_decay, a->grad_clip, a->seed};
    rng_init(&r->sample_rng, a->seed + 1);
    r->start_step = resume_step >= 0 ? resume_step : 0;
    r->resumed = resume_step >= 0;
    if (resume_step > r->max_steps) {
        fail_all(rank, "-x %d: the checkpoint in '%s' is of step %d, past it: nothing to run (give -x %d or more, or "
                 "another -o)", r->max_steps, a->output_dir, resume_step, resume_step);
    }
    if (resume_step >= 0) {
        int was = load_state(&r->model, a->output_dir, resume_step, &r->train_loader, &r->sample_rng, a->layout.total_batch);
        if (rank == 0) { printf("resumed from step %d of %s\n", resume_step, a->output_dir); }
        if (rank == 0 && was > 0 && was != r->max_steps && resume_step < r->max_steps) {
            printf("note: the checkpoint's run had -x %d, this one -x %d: the learning-rate schedule is stretched to %d steps\n",
                   was, r->max_steps, r->max_steps);
        }
    }
}

// What a step reads beside the model: the end-of-text token, the sampler, retention, the timing flags, each GEMM's
// cuBLASLt algorithm (run_setup's)
static void run_setup_rest(Run *r) {
    Args *a = &r->args;
    r->eot = r->tokenizer.init_ok ? r->tokenizer.eot_token : r->config.vocab_size - 1;
    r->ids_note = a->train_pattern || a->val_pattern ? " token ids (no tokenizer.bin with the model's vocabulary beside the shards)"
                                   : " token ids (the built-in corpus is a Markov chain over token ids, not text)";
    r->sampling = args_samples(a);
    if (r->sampling) {
        Model *m = &r->model;
        sampler_init(&r->sampler, (size_t)m->B * m->T * r->grid.cp, r->nprompt + a->gen_tokens + 1,
                     r->config.padded_vocab_size, m->last, a->temperature, a->top_k);
    }
    ckpt_keep_newest = a->keep_newest;
    ckpt_keep_every = a->keep_every;
    r->saved = -1;
    r->model.moe.stats.time_a2a = a->comm_report && r->config.num_experts > 0;
    r->model.pipe.time_waits = a->comm_report || a->trace_dir != NULL;
    // each GEMM's cuBLASLt algorithm: a one-rank run times the candidates once and keeps them in -o (matmul.h)
    static char choices[1100];
    matmul_tune = !a->deterministic && r->world == 1;
    if (matmul_tune && a->output_dir) {
        path_join(choices, a->output_dir, "gemm_choices.txt");
        matmul_choices_path = choices;
    }
#ifdef USE_CUDA
    if (matmul_tune) { matmul_choices_load(); }
#endif
}

// The model, the grid, this rank's part of the model, the data, the output dir, and the state of a
// resumed run. A fresh run's shape alone says whether it fits: it is checked before the weights are
// made (a resumed one's shape is in its checkpoint).
static void run_setup(Run *r) {
    Args *a = &r->args;
    int rank = r->rank, world = r->world;
    if (a->resume && a->output_dir == NULL) { fail_all(rank, "-y needs an output dir (-o)"); }
    if (!a->resume) { plan_config(a, rank, &r->config); setup_grid(a, &r->config, &r->grid, world, rank); }
    int resume_step;
    float *params = load_model(a, rank, &r->config, &resume_step);
    if (a->resume) { setup_grid(a, &r->config, &r->grid, world, rank); }
    r->prompt = sampler_prompt(a->prompt, a->prompt_ids, r->config.vocab_size, rank, &r->nprompt);
    // (checked before anything is written)
    r->have_val = data_setup(a->train_pattern, a->val_pattern, a->shuffle, a->seed, a->layout.B, a->layout.T,
                             r->config.vocab_size, &r->grid, &r->train_loader, &r->val_loader, &r->tokenizer);
    if (a->hellaswag) { hellaswag_load(&r->hellaswag, a->hellaswag, r->config.vocab_size); }
    run_agree_on_inputs(r, params);
    if (a->output_dir) {
        check_output_dir(a->output_dir, rank);
        lock_output_dir(a->output_dir, rank);
        run_dir_prepare(a->output_dir, rank, resume_step, a->overwrite, args_run_id(a, r->train_loader.fingerprint));
    }
    if (a->trace_dir) { check_output_dir(a->trace_dir, rank); }
    trace_open(a->trace_dir, rank);
    ModelOptions options = model_options(&a->layout, a, moe_options(a, &r->config), r->grid.dp);
    gpt2_init(&r->model, &r->config, params, &r->grid, &options);
    free(params);
    r->accum = options.accum;
    if (rank == 0) {
        Model *m = &r->model;
        print_setup(&a->layout, &r->config, moe_options(a, &r->config), &r->grid, m->num_parameters, m->moe.dispatch.cap,
                    m->moe.shape.El, r->accum);
    }
    run_setup_schedule(r, resume_step);
    r->logf = a->output_dir && rank == 0 ? open_log(a->output_dir, r->start_step) : -1;
    run_setup_rest(r);
    mem_setup_done();   // from here no buffer is allocated or freed (alloc.h)
}

// The step's line (report.h): the MoE layers' numbers gathered on every rank, the line on rank 0.
static void run_log_step(Run *r, int step, StepResult res, float lr, StepClock clock) {
    Model *m = &r->model;
    const ModelConfig *c = &r->config;
    MoEStepLoad moe = moe_step_load(&m->moe, m->grid, num_moe_layers(c), (double)m->B * r->accum * r->grid.dp,
                                    (double)m->T * r->grid.cp);
    const Layout *lay = &r->args.layout;
    double flops = (6.0 * m->num_parameters + 6.0 * c->num_layers * c->channels * lay->T) * lay->total_batch;
    StepLine line = {step, r->max_steps, res.loss, res.norm, lr, res.why, m->guard.skips_in_a_row, m->guard.loss_limit,
                     m->guard.norm_limit, (double)lay->total_batch, step_mfu(flops, clock.ms, r->world), clock};
    if (r->rank == 0) { log_step(r->logf, &line, &moe); }
    free(moe.load); free(moe.kept);
}

// The validation loss over -m batches of the val set (-1: all of them) with the model of `step`.
static void run_validate(Run *r, int step) {
    float vl = gpt2_validate(&r->model, &r->val_loader, r->args.val_batches);
    if (r->rank == 0) {
        printf("val loss %.6f | perplexity %.3f | step %d\n", vl, exp(vl), step);
        log_printf(r->logf, "s:%d tel:%.6f\n", step, vl);
    }
}

// HellaSwag's accuracy with the model of `step`: "HellaSwag: C/N = acc", and "s:STEP eval:ACC" in main.log.
static void run_hellaswag(Run *r, int step) {
    static int said_cut = 0;
    int counts[3];
    gpt2_hellaswag(&r->model, &r->hellaswag, counts);
    if (r->rank != 0) { return; }
    if (counts[2] && !said_cut) {
        printf("HellaSwag: %d of %d examples longer than -t %d tokens: their contexts cut from the left\n", counts[2],
               counts[1], r->model.T * r->grid.cp);
        said_cut = 1;
    }
    printf("HellaSwag: %d/%d = %f\n", counts[0], counts[1], (double)counts[0] / counts[1]);
    log_printf(r->logf, "s:%d eval:%.4f\n", step, (double)counts[0] / counts[1]);
}

static void run_sample(Run *r) {
    gpt2_sample(&r->model, &r->sampler, &r->tokenizer, &r->sample_rng, r->prompt, r->nprompt, r->args.gen_tokens, r->eot,
                r->ids_note);
}

// One training step: validation and a sample when due, forward and backward, AdamW, the log, a checkpoint
// when due.
static void run_step(Run *r, int step) {
    Args *a = &r->args;
    Model *m = &r->model;
    flight_step(step);
    if (r->have_val && a->val_every > 0 && step % a->val_every == 0) { run_validate(r, step); }
    if (r->hellaswag.n && a->val_every > 0 && step > 0 && step % a->val_every == 0) { run_hellaswag(r, step); }
    if (a->sample_every > 0 && step > 0 && step % a->sample_every == 0) { run_sample(r); }
    if (test_hook_alloc_at_step(step)) { mem_alloc(256, MEM_WORKSPACE); }
    comm_reset_counters(&r->grid);
    m->pipe.wait_seconds = m->moe.stats.a2a_seconds = 0.0;
    Span s = span_open(SPAN_SAME_LAYER, 0, "step", "step");
    double t0 = monotonic_seconds();
    if (step == r->start_step) { r->t_start = t0; }
    gpt2_forward_backward(m, &r->train_loader, r->accum);
    if (r->rank == 0 && test_hook_inject_nan(step)) { zero_poison_gradient(&m->zero); }   // (a test hook)
    float lr = lr_at(&r->sched, step);
    float fixed = 2.0f * logf((float)r->config.vocab_size), sl = outlier_limit(&r->losses, a->skip_loss_z);
    m->guard.loss_limit = sl < fixed ? sl : fixed;
    m->guard.norm_limit = outlier_limit(&r->norms, a->skip_norm_z);
    StepResult res = gpt2_update(m, &r->opt, lr, step);
    if (res.why == SKIP_NONE) { outlier_add(&r->losses, res.loss); outlier_add(&r->norms, res.norm); }
    device_synchronize();
    double ms = (monotonic_seconds() - t0) * 1e3;
    span_close(s, NULL, "\"step\":%d,\"pipeline_wait_ms\":%.3f", step, m->pipe.wait_seconds * 1e3);
    trace_flush();   // (CUDA: the step's spans from their events, now that the step has ended)
    if (step > r->start_step) { step_times_add(&r->times, &r->grid, ms, m->pipe.wait_seconds, m->moe.stats.a2a_seconds); }
    else {   // (the first step's costs are not counted either: report_costs)
        memset(m->costs.layer, 0, m->Ls * sizeof(double));
        m->costs.head = m->costs.embed = 0;
        m->costs.micro_batches = 0;
    }
    double per_step = r->times.steps > 0 ? r->times.total_ms / r->times.steps : ms;
    StepClock clock = {monotonic_seconds() - r->t_start, per_step * (r->max_steps - step - 1) / 1e3, ms};
    run_log_step(r, step, res, lr, clock);
    if (m->guard.skips_in_a_row >= a->max_skips) {
        fail_all(r->rank,
                 "step %d: %d updates in a row skipped for a non-finite or diverging loss or gradient norm (--max-skips "
                 "%d); the parameters are those before step %d, and no checkpoint holds a non-finite value", step + 1,
                 m->guard.skips_in_a_row, a->max_skips, step + 2 - m->guard.skips_in_a_row);
    }
    if (step == r->start_step) {
        report_first_step(&a->layout, a->comm_report, a->memory_report, &r->grid, m->pipe.nslots, m->vpp, r->accum);
        r->allocations = mem_allocations;
#ifdef USE_CUDA
        if (matmul_tune) { matmul_choices_save(); }   // (every problem of a step has made its choice)
#endif
    }
    if (a->checkpoint_every > 0 && (step + 1) % a->checkpoint_every == 0) {
        save_checkpoint(m, a->output_dir, step + 1, &r->train_loader, &r->sample_rng, a->layout.total_batch,
                        a->async_checkpoint, r->max_steps);
        r->saved = step + 1;
    } else if (r->rank == 0) {
        checkpoint_done_if_finished();   // an asynchronous write finished since: mark it DONE now
    }
}

// A stop asked for by a signal, on any rank: every rank agrees here, writes a checkpoint, and the run ends
// (exit 0). Returns whether it stops.
static int run_stop_requested(Run *r, int step) {
    int stop = stop_signal;
    comm_host_all_reduce(&r->grid.world, &stop, 1, DT_INT, HOST_MAX, "all-reduce (stop request)");
    if (!stop || step + 1 >= r->max_steps) { return 0; }
    Args *a = &r->args;
    if (a->output_dir && r->saved != step + 1) {
        save_checkpoint(&r->model, a->output_dir, step + 1, &r->train_loader, &r->sample_rng, a->layout.total_batch, 0,
                        r->max_steps);
    }
    checkpoint_wait();
    if (r->rank == 0) {
        printf("stopped by %s after step %d: %s\n", signal_name(stop), step + 1,
               a->output_dir ? "checkpoint written, resume with -y 1" : "no -o, so no checkpoint");
    }
    return 1;
}

// The end (unless a signal stopped the run): the last step's model and state with -o (unless a checkpoint
// of that step is there: the one resumed from, or one just written), validation, a sample; then the
// reports, everything closed. With -x 0 (or resumed at -x) no step runs, and the end's work is all there is.
static void run_finish(Run *r, int stopped) {
    Args *a = &r->args;
    int ran = r->max_steps > r->start_step;
    if (!stopped) {
        if (a->memory_report && !ran) { mem_report(r->rank, r->world, "set up, no step run (-x 0)"); }
        if (a->output_dir && r->saved != r->max_steps && !(r->resumed && !ran)) {
            save_checkpoint(&r->model, a->output_dir, r->max_steps, &r->train_loader, &r->sample_rng, a->layout.total_batch, 0,
                            r->max_steps);
        }
        if (r->have_val && a->val_every > 0) { run_validate(r, r->max_steps); }
        if (r->hellaswag.n) { run_hellaswag(r, r->max_steps); }
        if (r->sampling) { run_sample(r); }
    }
    checkpoint_wait();
    if (a->memory_report && ran) {
        mem_report(r->rank, r->world, "at the end of the run");
        double after = (double)(mem_allocations - r->allocations);
        comm_host_all_reduce(&r->grid.world, &after, 1, DT_DOUBLE, HOST_MAX, "all-reduce (allocations)");
        if (r->rank == 0) { printf("device allocations after the first step: %.0f (none expected)\n", after); }
    }
    Model *m = &r->model;
    double *costs = stage_costs_per_layer(&m->costs, r->config.num_layers, m->layer_id, m->Ls, m->first, m->last,
                                          &r->grid);
    report_times(&a->layout, a->comm_report, a->output_dir, &r->grid, &r->times, r->accum, r->model.vpp, costs,
                 &r->config, r->model.moe.stats.time_a2a);
    free(costs);
    log_close(r->logf);
    trace_close();
    tokenizer_free(&r->tokenizer);
    dataloader_free(&r->train_loader);
    if (r->have_val) { dataloader_free(&r->val_loader); }
    mem_free_all();
    grid_free(&r->grid);
}

// --plan N (the plan of the command line's layout, the levers over --memory-limit) or --plan-search N (every layout
// of N ranks): on one process, no weights, no device, no data
static void run_plan(const Run *r) {
    const Args *a = &r->args;
    PlanBuild b = plan_build(a->plan_precision);
    Machine mc = plan_machine(a->machine, a->gpus_per_node);
    MoEOptions moe = moe_options(a, &r->config);
    if (a->plan) { plan_report(&a->layout, &r->config, moe, a->plan, b, mc, a->memory_limit); }
    else { plan_search(&a->layout, &r->config, moe, a->plan_search, b, mc, a->memory_limit); }
}

#ifndef TESTING
int main(int argc, char **argv) {
    backend_env_before_init();    // (CUDA: before any context exists)
    watchdog_start(argc, argv);   // before MPI_Init: from here a stalled peer stops this rank
    test_hook_stall("init", -1);
    mpi_init_watched(&argc, &argv);
    static Run run;
    Run *r = &run;
    MPI_Comm_size(MPI_COMM_WORLD, &r->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    watchdog_rank(r->rank);
    default_args(&r->args);
    parse_args(argc, argv, &r->args);
    plan_model = gpt2_plan;   // (the memory plan of llmc/plan.h runs this model's set-up)
    plan_args = &r->args;
    signals_install();
    agree_on_args(&r->args, r->rank, r->world);
    attention_path = attention_path_of(r->args.layout.attention);
    if (r->args.machine) {   // (read here so that a bad file stops any run, not only a plan's advice)
        Machine mc = machine_default();
        char err[512];
        if (machine_read(&mc, r->args.machine, err, sizeof(err))) { fail_all(r->rank, "%s", err); }
    }
    if (r->args.plan) {   // the memory plan for --plan N ranks, on one process: no weights, no device, no data
        plan_config(&r->args, r->rank, &r->config);
        validate_layout(&r->args, &r->config, r->args.plan, r->rank);
        if (r->rank == 0) { run_plan(r); }
        mpi_finalize_watched();
        return 0;
    }
    if (r->args.calibrate) {   // the machine's rates, every rank measuring at once
        plan_config(&r->args, r->rank, &r->config);
        static Grid grid;
        grid_init(&grid, 1, 1, 1, 1);
        calibrate(&r->args.layout, &r->config, &grid, r->args.calibrate);
        mpi_finalize_watched();
        return 0;
    }
    if (r->args.plan_search) {   // every layout of N ranks, planned and timed, on one process
        plan_config(&r->args, r->rank, &r->config);
        if (r->rank == 0) { run_plan(r); }
        mpi_finalize_watched();
        return 0;
    }
    run_setup(r);
    int step = r->start_step, stopped = 0;
    for (; step < r->max_steps && !stopped; step++) {
        run_step(r, step);
        stopped = run_stop_requested(r, step);
    }
    run_finish(r, stopped || step != r->max_steps);
    test_hook_stall("end", r->rank);
    mpi_finalize_watched();   // (a peer stalled here: exit 1 after --timeout, the run's files complete)
    return 0;
}
#endif
