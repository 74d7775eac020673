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
// The workspace: one buffer, allocated at set-up (cudnn_attention_setup) at the size the memory plan counts, which
// is cuDNN's own number (cudnn_workspace_bytes below): no allocation after set-up, and the plan equals the need.
#ifndef LLMC_CUDNN_ATTENTION_H
#define LLMC_CUDNN_ATTENTION_H

#include <stddef.h>

// cuDNN's workspace need for one shape can only be known from its built graphs on the device (the engine cuDNN picks
// for this GPU and version decides it). Without a device (--plan, --plan-search: no device is initialised; a build
// planning for another machine) a plan counts this estimate instead, derived from cuDNN frontend 1.32's SDPA
// backward (cudnn_frontend/node/scaled_dot_product_flash_attention.h, CompositeSDPABackwardNode) with cuDNN 9 on
// Hopper, for the graph built here (bf16 io, fp32 stats, causal, deterministic):
//   - the frontend's own part: softmax_sum (B, NH, T) fp32, plus, where the dP workspace is not used, dQ_accum
//     (B, NH, T, HS) fp32;
//   - the deterministic backward on sm_90 takes the dP-workspace engine (use_dp_workspace: forced by
//     set_deterministic_algorithm unless CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT opts into ordered dQ), whose engine
//     workspace is dP in bf16, (B, NH, T rounded up to 64, T rounded up to 128) x 2 bytes; measured on an H200 at
//     B 16 T 1024 NH 12 HS 64: 403439872 bytes = 2 B NH T T + 4 B NH T + 256;
//   - the larger of the two paths, plus 1 MiB for the engine's small own part (256 bytes there) and the forward's.
// It is an estimate for a plan made away from the GPU; a run always plans with the device's number.
static size_t cudnn_workspace_estimate(int B, int T, int NH, int HS) {
    size_t b = (size_t)B, h = (size_t)NH, t = (size_t)T;
    size_t dp = b * h * ((t + 63) / 64 * 64) * ((t + 127) / 128 * 128) * 2, dq = b * h * t * (size_t)HS * sizeof(float);
    return b * h * t * sizeof(float) + (dp > dq ? dp : dq) + ((size_t)1 << 20);
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

enum { CUDNN_Q = 1, CUDNN_K, CUDNN_V, CUDNN_O, CUDNN_STATS, CUDNN_SCALE, CUDNN_DO, CUDNN_DQ, CUDNN_DK, CUDNN_DV };
typedef std::tuple<int, int, int, int, int, int> CudnnKey;   // B, T, NH, KV, HS, backward
typedef struct { std::shared_ptr<fe::graph::Graph> graph; size_t need; } CudnnGraph;   // need: its workspace bytes
static cudnnHandle_t cudnn_handle = NULL;
static std::map<CudnnKey, CudnnGraph> cudnn_graphs;
static void *cudnn_workspace = NULL;
static size_t cudnn_workspace_size = 0;

// The graph of one shape and direction, built on first use and kept (a plan made in a run builds the run's two,
// set-up finds them): NULL, with cuDNN's words in why, if cuDNN cannot build it.
static const CudnnGraph *cudnn_graph_try(int B, int T, int NH, int KV, int HS, int backward, char *why, size_t n) {
    CudnnKey key(B, T, NH, KV, HS, backward);
    auto found = cudnn_graphs.find(key);
    if (found != cudnn_graphs.end()) { return &found->second; }
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
    auto ok = [&](fe::error_t err, const char *step) {
        if (err.is_bad()) { snprintf(why, n, "cuDNN frontend: %s: %s", step, err.get_message().c_str()); }
        return err.is_good();
    };
    int64_t need = -1;
    if (!ok(g->validate(), "validate") || !ok(g->build_operation_graph(cudnn_handle), "build_operation_graph") ||
        !ok(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
        !ok(g->check_support(), "check_support") || !ok(g->build_plans(), "build_plans") ||
        !ok(g->get_workspace_size(need), "get_workspace_size")) {
        return NULL;
    }
    if (need < 0) { snprintf(why, n, "cuDNN frontend: get_workspace_size: %lld bytes", (long long)need); return NULL; }
    return &(cudnn_graphs[key] = CudnnGraph{g, (size_t)need});
}

// ... or the run stops with cuDNN's words.
static const CudnnGraph *cudnn_graph(int B, int T, int NH, int KV, int HS, int backward) {
    char why[512];
    const CudnnGraph *g = cudnn_graph_try(B, T, NH, KV, HS, backward, why, sizeof(why));
    if (g == NULL) {
        fail("--attention cudnn: cuDNN cannot run the %s attention at B %d T %d NH %d KV %d HS %d: %s",
             backward ? "backward" : "forward", B, T, NH, KV, HS, why);
    }
    return g;
}
#endif

// What cuDNN's attention at this shape needs for its workspace, the number the memory plan counts and set-up
// allocates: in a run (a device, this build's bf16) the larger of what its forward and backward graphs report
// (they share the buffer, one after the other on the compute stream), the graphs built now and kept for set-up;
// without a device, or where a graph cannot be built (set-up then stops with cuDNN's words), the estimate above.
static size_t cudnn_workspace_bytes(int B, int T, int NH, int KV, int HS) {
#if defined(USE_CUDA) && defined(USE_CUDNN) && !defined(ENABLE_FP32)
    if (device_ready) {
        char why[512];
        const CudnnGraph *f = cudnn_graph_try(B, T, NH, KV, HS, 0, why, sizeof(why));
        const CudnnGraph *b = f ? cudnn_graph_try(B, T, NH, KV, HS, 1, why, sizeof(why)) : NULL;
        if (f && b) { return f->need > b->need ? f->need : b->need; }
    }
#else
    (void)KV;
#endif
    return cudnn_workspace_estimate(B, T, NH, HS);
}

#if defined(USE_CUDA) && defined(USE_CUDNN) && !defined(ENABLE_FP32)
// Set-up: the run's two graphs, and the workspace at their need (what the plan counted). After set-up it only
// looks up: a shape set-up did not see stops the run (a bug: set-up sees the largest shape the attention runs).
static void cudnn_attention_setup(int B, int T, int NH, int KV, int hs) {
    const CudnnGraph *f = cudnn_graph(B, T, NH, KV, hs, 0), *b = cudnn_graph(B, T, NH, KV, hs, 1);
    size_t need = f->need > b->need ? f->need : b->need;
    if (need <= cudnn_workspace_size) { return; }
    if (device_setup_done) {
        fail("--attention cudnn: at B %d T %d NH %d KV %d HS %d cuDNN needs a %zu-byte workspace after set-up, which "
             "allocated %zu for the shapes it saw (a bug)", B, T, NH, KV, hs, need, cudnn_workspace_size);
    }
    if (cudnn_workspace != NULL) { mem_free(cudnn_workspace); }
    cudnn_workspace = mem_alloc(need, MEM_WORKSPACE);
    cudnn_workspace_size = need;
}

// The graph of a call, its workspace checked against the buffer's (set-up made it large enough: a bug otherwise).
static const CudnnGraph *cudnn_graph_for_call(int B, int T, int NH, int KV, int hs, int backward) {
    cudnn_attention_setup(B, T, NH, KV, hs);   // (set up before: look-ups)
    const CudnnGraph *g = cudnn_graph(B, T, NH, KV, hs, backward);
    if (g->need > cudnn_workspace_size) {
        fail("--attention cudnn: cuDNN's %s graph at B %d T %d NH %d KV %d HS %d needs a %zu-byte workspace, the buffer "
             "holds %zu (a bug: set-up allocates what the graphs report)", backward ? "backward" : "forward", B, T, NH,
             KV, hs, g->need, cudnn_workspace_size);
    }
    cudnn_check(cudnnSetStream(cudnn_handle, main_stream), "cudnnSetStream");
    return g;
}

static void cudnn_execute(const CudnnGraph *g, std::unordered_map<int64_t, void *> &pack, const char *what) {
    fe::error_t err = g->graph->execute(cudnn_handle, pack, cudnn_workspace);
    if (err.is_bad()) { fail("cuDNN frontend: execute (%s): %s", what, err.get_message().c_str()); }
}

// qkv (B, T, (NH + 2KV) hs) -> out (B, T, NH hs), lse (B, NH, T)
static void attention_forward_cudnn(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int KV, int hs) {
    const CudnnGraph *g = cudnn_graph_for_call(B, T, NH, KV, hs, 0);
    float scale = 1.0f / sqrtf((float)hs);
    const floatX *k = qkv + (size_t)NH * hs, *v = k + (size_t)KV * hs;
    std::unordered_map<int64_t, void *> pack = {
        {CUDNN_Q, (void *)qkv}, {CUDNN_K, (void *)k}, {CUDNN_V, (void *)v},
        {CUDNN_SCALE, &scale}, {CUDNN_O, out}, {CUDNN_STATS, lse}};
    cudnn_execute(g, pack, "forward");
}

// dout (B, T, NH hs) -> dqkv (B, T, (NH + 2KV) hs) (written)
static void attention_backward_cudnn(floatX *dqkv, const floatX *dout, const floatX *qkv, const floatX *out,
                                     const float *lse, int B, int T, int NH, int KV, int hs) {
    const CudnnGraph *g = cudnn_graph_for_call(B, T, NH, KV, hs, 1);
    float scale = 1.0f / sqrtf((float)hs);
    const floatX *k = qkv + (size_t)NH * hs, *v = k + (size_t)KV * hs;
    floatX *dk = dqkv + (size_t)NH * hs, *dv = dk + (size_t)KV * hs;
    std::unordered_map<int64_t, void *> pack = {
        {CUDNN_Q, (void *)qkv}, {CUDNN_K, (void *)k}, {CUDNN_V, (void *)v},
        {CUDNN_SCALE, &scale}, {CUDNN_O, (void *)out}, {CUDNN_DO, (void *)dout}, {CUDNN_STATS, (void *)lse},
        {CUDNN_DQ, dqkv}, {CUDNN_DK, dk}, {CUDNN_DV, dv}};
    cudnn_execute(g, pack, "backward");
}
#endif

#endif
