// Causal attention through cuDNN's fused scaled-dot-product attention (--attention cudnn; a build with
// make USE_CUDNN=1): llm.c's fast path, beside the hand-written kernels (flash_attention.h, the teaching path,
// and the default cuBLAS path). cuDNN's frontend (header-only C++, PyPI's nvidia-cudnn-frontend, installed into
// .venv by scripts/setup.sh) builds one graph per shape, forward and backward, once, and caches them; the
// backward is cuDNN's deterministic algorithm. The math is attention_forward_cpu / attention_backward_cpu's:
//   forward  qkv (B, T, (NH + 2KV) HS) -> out (B, T, NH HS), lse (B, NH, T) = log sum exp of the scaled scores
//            (natural log, the "Stats" output: the same lse the other paths keep, so the backward of any path
//            could read it)
//   backward dout, qkv, out, lse -> dqkv (B, T, (NH + 2KV) HS)
// The tensors are viewed as (B, heads, T, HS) with strides into the interleaved buffers: q (NH heads), k, v (KV
// heads each: grouped-query attention, cuDNN's GQA, query head h reading kv head h / (NH / KV)) are column
// offsets 0, NH HS, (NH + KV) HS of rows (NH + 2KV) HS apart, head h at column h HS. bf16 builds only (cuDNN's
// SDPA has no fp32).
// The workspace is allocated at set-up (cudnn_attention_setup) at its planned size; a graph that asks for more
// stops the run there, naming both numbers.
#ifndef LLMC_CUDNN_ATTENTION_H
#define LLMC_CUDNN_ATTENTION_H

#include <stddef.h>

// What a plan counts for cuDNN's workspace (every build: a memory plan counts what the GPU allocates): the
// deterministic backward accumulates dQ in fp32, (B, T, C) floats (C = NH HS), and keeps a (B, NH, T) row
// statistic; the rest is a fixed allowance. (GQA: the frontend's dK, dV of all NH heads, summed over each group,
// are virtual tensors for dense inputs, no workspace; a graph that asks for more stops the run at set-up.)
static size_t cudnn_workspace_bytes(int B, int T, int C, int NH) {
    return (size_t)B * T * C * sizeof(float) + (size_t)B * NH * T * sizeof(float) + ((size_t)32 << 20);
}

#if defined(USE_CUDA) && defined(USE_CUDNN) && !defined(ENABLE_FP32)
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <map>
#include <tuple>
#include <memory>

namespace fe = cudnn_frontend;

static void cudnn_check(cudnnStatus_t status, const char *what) {
    if (status != CUDNN_STATUS_SUCCESS) { fail("cuDNN: %s: %s", what, cudnnGetErrorString(status)); }
}
static void cudnn_fe_check(fe::error_t err, const char *what) {
    if (err.is_bad()) { fail("cuDNN frontend: %s: %s", what, err.get_message().c_str()); }
}

enum { CUDNN_Q = 1, CUDNN_K, CUDNN_V, CUDNN_O, CUDNN_STATS, CUDNN_SCALE, CUDNN_DO, CUDNN_DQ, CUDNN_DK, CUDNN_DV };
typedef std::tuple<int, int, int, int, int, int> CudnnKey;   // B, T, NH, KV, HS, backward
static cudnnHandle_t cudnn_handle = NULL;
static std::map<CudnnKey, std::shared_ptr<fe::graph::Graph>> cudnn_graphs;
static void *cudnn_workspace = NULL;
static size_t cudnn_workspace_size = 0;

// The graph of one shape and direction, built on first use (set-up builds the run's two).
static std::shared_ptr<fe::graph::Graph> cudnn_graph(int B, int T, int NH, int KV, int HS, int backward) {
    CudnnKey key(B, T, NH, KV, HS, backward);
    auto found = cudnn_graphs.find(key);
    if (found != cudnn_graphs.end()) { return found->second; }
    if (cudnn_handle == NULL) { cudnn_check(cudnnCreate(&cudnn_handle), "cudnnCreate"); }
    cudnn_check(cudnnSetStream(cudnn_handle, main_stream), "cudnnSetStream");
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    int64_t b = B, h = NH, t = T, d = HS, C = (int64_t)NH * HS, W = (int64_t)(NH + 2 * KV) * HS;
    std::vector<int64_t> dims = {b, h, t, d}, kv_dims = {b, KV, t, d}, in_qkv = {t * W, d, W, 1},
                         in_out = {t * C, d, C, 1};
    std::vector<int64_t> stat_dims = {b, h, t, 1}, stat_stride = {h * t, t, 1, 1};
    auto view = [&](const char *name, int64_t uid, const std::vector<int64_t> &dim,
                    const std::vector<int64_t> &stride) {
        return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
    };
    auto Q = view("Q", CUDNN_Q, dims, in_qkv), K = view("K", CUDNN_K, kv_dims, in_qkv);
    auto V = view("V", CUDNN_V, kv_dims, in_qkv);
    auto scale = g->tensor(fe::graph::Tensor_attributes().set_name("scale").set_uid(CUDNN_SCALE)
                               .set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1})
                               .set_is_pass_by_value(true).set_data_type(fe::DataType_t::FLOAT));
    if (!backward) {
        auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true)
                           .set_attn_scale(scale).set_causal_mask(true);
        auto [O, stats] = g->sdpa(Q, K, V, options);
        O->set_output(true).set_uid(CUDNN_O).set_dim(dims).set_stride(in_out);
        stats->set_output(true).set_uid(CUDNN_STATS).set_data_type(fe::DataType_t::FLOAT)
            .set_dim(stat_dims).set_stride(stat_stride);
    } else {
        auto O = view("O", CUDNN_O, dims, in_out), dO = view("dO", CUDNN_DO, dims, in_out);
        auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(CUDNN_STATS)
                                   .set_dim(stat_dims).set_stride(stat_stride).set_data_type(fe::DataType_t::FLOAT));
        auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(scale)
                           .set_causal_mask(true).set_deterministic_algorithm(true);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, options);
        dQ->set_output(true).set_uid(CUDNN_DQ).set_dim(dims).set_stride(in_qkv);
        dK->set_output(true).set_uid(CUDNN_DK).set_dim(kv_dims).set_stride(in_qkv);
        dV->set_output(true).set_uid(CUDNN_DV).set_dim(kv_dims).set_stride(in_qkv);
    }
    cudnn_fe_check(g->validate(), "validate");
    cudnn_fe_check(g->build_operation_graph(cudnn_handle), "build_operation_graph");
    cudnn_fe_check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    cudnn_fe_check(g->check_support(), "check_support");
    cudnn_fe_check(g->build_plans(), "build_plans");
    int64_t need = 0;
    cudnn_fe_check(g->get_workspace_size(need), "get_workspace_size");
    if ((size_t)need > cudnn_workspace_size) {
        fail("--attention cudnn: cuDNN's %s graph at B %d T %d NH %d KV %d HS %d needs a %lld-byte workspace, the plan "
             "gave %zu (llmc/cudnn_attention.h: cudnn_workspace_bytes)", backward ? "backward" : "forward", B, T, NH,
             KV, HS, (long long)need, cudnn_workspace_size);
    }
    cudnn_graphs[key] = g;
    return g;
}

// Set-up: the workspace at its planned size, and the run's two graphs.
static void cudnn_attention_setup(int B, int T, int NH, int KV, int hs) {
    size_t bytes = cudnn_workspace_bytes(B, T, NH * hs, NH);
    if (bytes > cudnn_workspace_size) {
        if (cudnn_workspace != NULL) { mem_free(cudnn_workspace); }
        cudnn_workspace = mem_alloc(bytes, MEM_WORKSPACE);
        cudnn_workspace_size = bytes;
    }
    cudnn_graph(B, T, NH, KV, hs, 0);
    cudnn_graph(B, T, NH, KV, hs, 1);
}

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T)
static void attention_forward_cudnn(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV, int hs) {
    cudnn_attention_setup(B, T, NH, KV, hs);   // (set up before: a look-up)
    float scale = 1.0f / sqrtf((float)hs);
    const floatX *k = qkv + (size_t)NH * hs, *v = k + (size_t)KV * hs;
    std::unordered_map<int64_t, void *> pack = {
        {CUDNN_Q, (void *)qkv}, {CUDNN_K, (void *)k}, {CUDNN_V, (void *)v},
        {CUDNN_SCALE, &scale}, {CUDNN_O, out}, {CUDNN_STATS, lse}};
    cudnn_check(cudnnSetStream(cudnn_handle, main_stream), "cudnnSetStream");
    cudnn_fe_check(cudnn_graph(B, T, NH, KV, hs, 0)->execute(cudnn_handle, pack, cudnn_workspace), "execute (forward)");
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written)
static void attention_backward_cudnn(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                     const float *lse, int B, int T, int NH, int KV, int hs) {
    cudnn_attention_setup(B, T, NH, KV, hs);
    float scale = 1.0f / sqrtf((float)hs);
    const floatX *k = qkv + (size_t)NH * hs, *v = k + (size_t)KV * hs;
    floatX *dk = dqkv + (size_t)NH * hs, *dv = dk + (size_t)KV * hs;
    std::unordered_map<int64_t, void *> pack = {
        {CUDNN_Q, (void *)qkv}, {CUDNN_K, (void *)k}, {CUDNN_V, (void *)v},
        {CUDNN_SCALE, &scale}, {CUDNN_O, (void *)out}, {CUDNN_DO, (void *)dout}, {CUDNN_STATS, (void *)lse},
        {CUDNN_DQ, dqkv}, {CUDNN_DK, dk}, {CUDNN_DV, dv}};
    cudnn_check(cudnnSetStream(cudnn_handle, main_stream), "cudnnSetStream");
    cudnn_fe_check(cudnn_graph(B, T, NH, KV, hs, 1)->execute(cudnn_handle, pack, cudnn_workspace),
                   "execute (backward)");
}
#endif

#endif
