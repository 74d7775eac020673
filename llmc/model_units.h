// The model's units for zero.h (the embedding, each layer, the experts of each MoE layer, the final norm, the
// untied head), built from the tensor table (model_file.h), and a rank's part of a unit cut out of the
// file-order tensors or put back (tensor_parallel.h's slices, the local experts). The units are made in
// train_gpt.cu (build_units); checkpoints and test_gpt cut and gather through them.
#ifndef LLMC_MODEL_UNITS_H
#define LLMC_MODEL_UNITS_H

#include "utils.h"
#include "grid.h"
#include "tensor_parallel.h"
#include "zero.h"
#include "model_file.h"

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
