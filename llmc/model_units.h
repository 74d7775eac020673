// The model's units for zero.h (the embedding, each layer, the experts of each MoE layer, the final norm, the
// untied head), built from the tensor table (model_file.h), and a rank's part of a unit cut out of the
// file-order tensors or put back (tensor_parallel.h's slices, the local experts). A stage's units are made by
// build_units; checkpoints and test_gpt cut and gather through them.
#ifndef LLMC_MODEL_UNITS_H
#define LLMC_MODEL_UNITS_H

#include "utils.h"
#include "grid.h"
#include "tensor_parallel.h"
#include "zero.h"
#include "model_file.h"
#include "pipeline_split.h"

// One unit of zero.h: the embedding (wpe, wte), a layer, the experts of a MoE layer held by this ep
// rank, the final norm, or an untied LM head, reduced over data-parallel group dpg. Inside a unit the tensors whose
// gradients are partial over tp under SP come first (one block to all-reduce under SP). The tensors the model does
// not have (Llama's wpe and biases) are left out.
static void build_unit(const ModelConfig *c, int tp, int ep, int ep_rank, Group *dpg, Unit *U, const int *ids, int n,
                       int layer) {
    memset(U, 0, sizeof(Unit));
    U->dpg = dpg;
    for (int k = 0; k < n; k++) {
        TensorSpec s = tensor_spec(c, ids[k]);
        if (s.rows * s.cols == 0 || s.layers == 0) { continue; }   // (not in this model)
        UnitTensor *t = &U->t[U->ntensors++];
        t->id = ids[k];
        t->layer = layer;
        t->nblk = s.experts ? s.nblk / ep : s.nblk;   // the local experts [blk0, blk0 + nblk)
        t->blk0 = s.experts ? ep_rank * t->nblk : 0;
        t->offset = U->size;
        t->size = (size_t)t->nblk * s.rows * s.cols / (s.split == SPLIT_NONE ? 1 : tp);
        t->decay = s.decay;
        t->replicated = s.split == SPLIT_NONE;
        U->size += t->size;
        if (t->replicated && !s.full_grad) { U->nrep = U->size; }
        if (ids[k] == T_WTE || ids[k] == T_HEAD) { U->embedding = 1; }   // (ZeRO-3: a work buffer of their own)
    }
}

// The units of a pipeline stage, in the order they run: the embedding (first stage), its layers
// (a MoE layer: the layer, then its experts; interleaved: chunk 0's, then chunk 1's, ...), the final
// norm and an untied LM head (last stage). With a pipeline the first stage's wte and wpe are two units, and the
// last stage holds a copy of the wte unit for the tied LM head: same layout, so the two copies' gradients sum shard
// by shard. Returns the number of units; sets the index of each kind (-1: none; without a pipeline u_pos ==
// u_embed, one unit [wpe, wte]; Llama: no wpe) and, per layer of the stage, its unit and its experts' unit (-1 for a
// dense layer).
static int build_units(const ModelConfig *c, Grid *grid, int vpp, const int *first, Unit *units, int *u_embed,
                       int *u_pos, int *u_layer, int *u_experts, int *u_final, int *u_head) {
    static const int embedding[] = {T_WPE, T_WTE}, token[] = {T_WTE}, position[] = {T_WPE};
    static const int layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_FCPROJB, T_QNORMW, T_KNORMW,
                                T_QKVW, T_QKVB, T_ATTPROJW, T_FCW, T_FCB, T_FCPROJW};
    static const int moe_layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_QNORMW, T_KNORMW, T_ROUTERW, T_QKVW,
                                    T_QKVB, T_ATTPROJW};
    static const int moe_shared_layer[] = {T_LN1W, T_LN1B, T_ATTPROJB, T_LN2W, T_LN2B, T_QNORMW, T_KNORMW, T_ROUTERW,
                                           T_QKVW, T_QKVB, T_ATTPROJW, T_SFCW, T_SFCB, T_SFCPROJW, T_SFCPROJB,
                                           T_SGATEW};   // (+ shared)
    static const int experts[] = {T_EFCPROJB, T_EFCW, T_EFCB, T_EFCPROJW};
    static const int final_ln[] = {T_LNFW, T_LNFB}, head[] = {T_HEAD};
    int tp = grid->tp, pp = grid->pp, stage = grid->pp_rank, ep = grid->ep, er = grid->ep_rank, n = 0, ll = 0;
    Group *dp = grid->grad_group;   // (the dp group; with cp, the cp x dp ranks)
    *u_embed = *u_pos = *u_final = *u_head = -1;
    int wpe = tensor_full_size(c, T_WPE) > 0;
    if (stage == 0 && pp == 1) { *u_embed = *u_pos = n; build_unit(c, tp, ep, er, dp, &units[n++], embedding, 2, -1); }
    if (stage == 0 && pp > 1) {
        *u_embed = n; build_unit(c, tp, ep, er, dp, &units[n++], token, 1, -1);
        if (wpe) { *u_pos = n; build_unit(c, tp, ep, er, dp, &units[n++], position, 1, -1); }
    }
    for (int v = 0; v < vpp; v++) {   // the stage's model chunks (one without interleaving), in order
        int l0, l1;
        chunk_layers(first, pp, stage, v, &l0, &l1);
        for (int l = l0; l < l1; l++, ll++) {
            u_layer[ll] = n;
            u_experts[ll] = -1;
            if (!is_moe_layer(c, l)) { build_unit(c, tp, ep, er, dp, &units[n++], layer, 14, l); continue; }
            if (c->shared_experts > 0) { build_unit(c, tp, ep, er, dp, &units[n++], moe_shared_layer, 16, l); }
            else { build_unit(c, tp, ep, er, dp, &units[n++], moe_layer, 11, l); }
            u_experts[ll] = n;
            build_unit(c, tp, ep, er, &grid->edp_group, &units[n++], experts, 4, l);
        }
    }
    if (stage == pp - 1) {
        *u_final = n;
        build_unit(c, tp, ep, er, dp, &units[n++], final_ln, 2, -1);
        if (!c->tied) { *u_head = n; build_unit(c, tp, ep, er, dp, &units[n++], head, 1, -1); }
        if (pp > 1 && c->tied) {
            *u_embed = n;
            build_unit(c, tp, ep, er, dp, &units[n++], token, 1, -1);
            units[n - 1].norm_skip = 1;
        }
    }
    if (pp > 1 && *u_embed >= 0 && c->tied) { units[*u_embed].tied = 1; }
    return n;
}

// Pointers to each tensor of a unit, given the unit's base (parameters or gradients: same layout).
static void unit_view(const Unit *U, floatX *base, floatX *ptr[NUM_TENSORS]) {
    for (int k = 0; k < U->ntensors; k++) { ptr[U->t[k].id] = base + U->t[k].offset; }
}

// Host, fp32: cut this tp rank's unit (its local experts) out of the full tensors (to_unit = 1), or
// put it back.
static void unit_copy_full(const ModelConfig *c, const Unit *U, float *full[NUM_TENSORS], float *unit,
                           int tp, int tp_rank, int to_unit) {
    for (int k = 0; k < U->ntensors; k++) {
        const UnitTensor *t = &U->t[k];
        TensorSpec s = tensor_spec(c, t->id);
        size_t blk = s.rows * s.cols, per_layer = (size_t)s.nblk * blk;
        float *f = full[t->id] + (t->layer >= 0 ? (size_t)tensor_layer_slice(c, t->id, t->layer) * per_layer
                                  : 0) + (size_t)t->blk0 * blk;
        if (s.split == SPLIT_QKV) { tp_slice_copy_qkv(f, unit + t->offset, s.rows, s.qrows, s.cols, tp, tp_rank, to_unit); }
        else { tp_slice_copy(f, unit + t->offset, t->nblk, s.rows, s.cols, s.split, tp, tp_rank, to_unit); }
    }
}

#endif
