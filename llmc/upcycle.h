// Sparse upcycling: a MoE model made of a dense one (--upcycle, expert_parallel.h), each expert a copy of its
// layer's dense MLP.
#ifndef LLMC_UPCYCLE_H
#define LLMC_UPCYCLE_H

#include "utils.h"
#include "rand.h"
#include "model_file.h"

// Sparse upcycling: the MoE model `moe` from a dense model of the same shape, every expert of a MoE
// layer a copy of that layer's dense MLP; the router N(0, 0.02) from seed (or zeros: router_zero).
// (Also how test_gpt lays out a dense reference's gradients for an E = 1 model.)
static float *upcycle_dense(const ModelConfig *dense, float *dense_all, const ModelConfig *moe, uint64_t seed,
                            int router_zero) {
    float *all = (float *)calloc_check(model_floats(moe), sizeof(float));   // (the routing bias: zero)
    float *d[NUM_TENSORS], *t[NUM_TENSORS];
    split_tensors(dense, dense_all, d);
    split_tensors(moe, all, t);
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (i == T_FCW || i == T_FCB || i == T_FCPROJW || i == T_FCPROJB || is_moe_tensor(i)) { continue; }   // (below)
        memcpy(t[i], d[i], tensor_full_size(moe, i) * sizeof(float));
    }
    static const int mlp[4] = {T_FCW, T_FCB, T_FCPROJW, T_FCPROJB},
        experts[4] = {T_EFCW, T_EFCB, T_EFCPROJW, T_EFCPROJB};
    for (int l = 0; l < moe->num_layers; l++) {
        for (int i = 0; i < 4; i++) {
            TensorSpec s = tensor_spec(dense, mlp[i]);
            size_t n = (size_t)s.nblk * s.rows * s.cols;   // (a layer's: Llama's fcw is [gate; up])
            const float *src = d[mlp[i]] + (size_t)l * n;   // the dense model: every layer dense
            float *dst = is_moe_layer(moe, l)
                    ? t[experts[i]] + (size_t)tensor_layer_slice(moe, experts[i], l) * moe->num_experts * n
                                              : t[mlp[i]] + (size_t)tensor_layer_slice(moe, mlp[i], l) * n;
            for (int e = 0; e < (is_moe_layer(moe, l) ? moe->num_experts : 1); e++) {
                memcpy(dst + (size_t)e * n, src, n * sizeof(float));
            }
        }
    }
    Rng rng;
    rng_init(&rng, seed);
    for (size_t j = 0; j < tensor_full_size(moe, T_ROUTERW); j++) {
        t[T_ROUTERW][j] = router_zero ? 0.0f : rng_normal(&rng, 0, 0.02f);
    }
    return all;
}

#endif
