// Muon (momentum orthogonalised by Newton-Schulz) for the 2-D matrices inside the blocks, distributed so that
// each matrix is orthogonalised once in the job, in any layout. Per matrix W stored [A, B], g its clipped gradient:
//   M = mu M + (1 - mu) g;   U = (1 - mu) g + mu M                        (Nesterov; M starts at 0)
//   X = U / max(|U|_F, 1e-7), transposed when A > B; 5 times: S = X X^T, X = a X + (b S + c S S^T) X
//   W = W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) X (transposed back)
// with (a, b, c) = (3.4445, -4.7750, 2.0315): torch.optim.Muon's update (adjust_lr_fn "match_rms_adamw", so one
// -l serves AdamW and Muon), in fp32. Muon's matrices, each its own: attention's q, k and v (GPT-2's three blocks
// of qkvw; Llama's q rows, k rows, v rows), the attention output, the MLP's fc and fc_proj (SwiGLU: gate, up and
// down), each expert's, the shared experts' as stored. Every other tensor keeps AdamW (zero.h).
//
// Distribution. The momentum is elementwise: a rank keeps it where it updates the parameters (zero.h's owned
// ranges), in the AdamW m array; AdamW's v has no place for Muon's elements (zero.h), so a Muon parameter carries
// one fp32 state. Newton-Schulz needs the whole matrix: each matrix has one OWNER among the ranks of its pipeline
// stage (and, an expert's, of its ep rank), chosen from the layout alone (greedy by Newton-Schulz FLOPs, so the
// work spreads; a memory plan of any rank knows them), and per step
//   1. every rank makes U for its elements; the rank whose ZeRO shard partition holds an element sends its U to
//      the element's owner (at stage 0 the dp replicas hold the same U: each sends its own partition);
//   2. the owner assembles each matrix it owns (tp slices, ZeRO shards, experts: wherever they were), runs
//      Newton-Schulz, and sends the scaled result back to every rank that updates each element;
//   3. each rank applies it to its elements (bf16: to the fp32 master, rounded stochastically as AdamW does).
// Two all-to-alls over the world per step, float per element each way; which element goes where is settled once
// at init (the positions exchanged then, so a step moves only values: an int per element and direction stays, in
// the comm buffers). U, the owners' matrices and Newton-Schulz's work are workspace.
#ifndef LLMC_MUON_H
#define LLMC_MUON_H

#include "utils.h"
#include "backend.h"
#include "alloc.h"
#include "comm.h"
#include "grid.h"
#include "zero.h"
#include "model_config.h"
#include "pipeline_split.h"

#define MUON_NS_STEPS 5
#define MUON_A 3.4445f
#define MUON_B (-4.7750f)
#define MUON_C 2.0315f

typedef struct {
    int id, layer, blk, part;   // tensor, layer, block (an expert's; GPT-2's q, k, v), part (Llama's q, k, v rows)
    size_t rows, cols;          // as stored
    int owner;                  // the world rank that orthogonalises it
    size_t at;                  // its offset in the owner's matrix buffer
} MuonMatrix;

typedef struct {   // a run of elements this rank updates: one tensor's part of a unit's owned range
    floatX *param;
    float *master, *m;          // master: NULL in the fp32 build
    const floatX *grad;
    size_t len, h;              // its elements are h .. h + len of this rank's list
    unsigned int seed;          // as AdamW's: the tensor and the run's place in it (+ the step's seed)
} MuonRun;

// A piece: slots [slot, slot + n) of an all-to-all buffer and the elements they are, in the rank's list (u) or in an
// owner's matrix: slot slot + i is element base + (j / w) S + j % w, j = i + phase (w = S = 1: base + i). A piece is
// one matrix's part of a rank's tp slice and ZeRO range: contiguous, or rows of w columns (a row-parallel slice).
typedef struct { size_t slot, n, base, phase, w, S; } MuonPiece;

// One direction of a step's all-to-all, from one side: its pieces (device; slots in peer order), counts and offsets
// per peer (host, elements), the slots in all.
typedef struct {
    MuonPiece *pieces;
    int npieces;
    size_t *counts, *offsets;
    size_t total;
} MuonMove;

typedef struct {
    float momentum;
    int nmat, owned;            // Muon matrices in the model; those this rank orthogonalises
    MuonMatrix *mat;
    int nrun;
    MuonRun *run;
    size_t n;                   // elements this rank updates
    float *u;                   // device (n): U, then the owners' results
    MuonMove send, recv;        // U: from this rank's list to the owners; into this rank's matrices (as owner)
    MuonMove serve, need;       // the results: from this rank's matrices to the ranks that update them; into u
    size_t nsend, nrecv, nserve;
    float *sendbuf, *recvbuf;   // device
    float *mats;                // device: the owned matrices, one after another
    size_t mats_size, work;     // largest owned matrix
    float *x, *y, *s, *t, *ss;  // device: Newton-Schulz's work (x, y: A B; s, t: min(A, B)^2; ss: one float)
    long ns_calls;              // Newton-Schulz runs since init (--check-comm: one per matrix per step in the job)
    double out;                 // elements this rank sends to other ranks per step, both all-to-alls (cost_model.h)
    Group *world;
} Muon;

static int muon_tensor(int id) {
    return id == T_QKVW || id == T_ATTPROJW || id == T_FCW || id == T_FCPROJW || id == T_EFCW || id == T_EFCPROJW ||
           id == T_SFCW || id == T_SFCPROJW;
}

// Marks Muon's tensors in the units, before zero_init lays out the optimizer state (zero.h: no v for them).
static void muon_mark_units(Unit *units, int n) {
    for (int u = 0; u < n; u++) {
        for (int k = 0; k < units[u].ntensors; k++) { units[u].t[k].muon = muon_tensor(units[u].t[k].id); }
    }
}

// ----------------------------------------------------------------------------
// the kernels: CPU loop beside the CUDA kernel

// M = mu M + (1 - mu) g s; u = (1 - mu) g s + mu M (s = *grad_scale; 0: a skipped step, nothing changes)
static void muon_momentum_cpu(float *m, float *u, const float *g, size_t n, float mu, const float *grad_scale) {
    float s = *grad_scale;
    if (s == 0.0f) { return; }
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * s;
        m[i] = mu * m[i] + (1.0f - mu) * gi;
        u[i] = (1.0f - mu) * gi + mu * m[i];
    }
}

// p = p (1 - lr wd) - lr o (o already scaled by 0.2 sqrt(max(A, B)))
static void muon_apply_cpu(float *params, float *master, const float *o, size_t n, float lr, float wd,
                           const float *grad_scale) {
    if (*grad_scale == 0.0f) { return; }
    for (size_t i = 0; i < n; i++) {
        float p = (master ? master[i] : params[i]) * (1.0f - lr * wd) - lr * o[i];
        if (master) { master[i] = p; }
        params[i] = p;
    }
}

// The element slot i of piece p is (MuonPiece above); the kernel's and the CPU loop's
#ifdef USE_CUDA
__host__ __device__
#endif
static inline size_t piece_element(const MuonPiece *p, size_t i) {
    size_t j = i + p->phase;
    return p->base + (j / p->w) * p->S + j % p->w;
}

// buf (slots) <- data (gather) or data <- buf (scatter), over the pieces (slots in order, covering [0, total))
static void move_pieces_cpu(float *buf, float *data, const MuonPiece *pc, int np, int gather) {
    for (int k = 0; k < np; k++) {
        for (size_t i = 0; i < pc[k].n; i++) {
            size_t e = piece_element(&pc[k], i);
            if (gather) { buf[pc[k].slot + i] = data[e]; } else { data[e] = buf[pc[k].slot + i]; }
        }
    }
}

// out (M, N) = alpha a (M, K) b^T (b (N, K)) + beta out, or with b (K, N) untransposed
static void muon_gemm_cpu(float *out, const float *a, const float *b, int M, int N, int K, int bt, float alpha,
                          float beta) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, bt ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, K, b, bt ? K : N, beta,
                out, N);
}

// ss[0] = sum of w^2 (n)
static void sum_squares_f32_cpu(float *ss, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)w[i] * w[i]; }
    ss[0] = (float)s;
}

// x = w (rows, cols) / max(sqrt(ss), 1e-7), transposed (x (cols, rows)) when tr
static void muon_load_cpu(float *x, const float *w, const float *ss, size_t rows, size_t cols, int tr) {
    float inv = 1.0f / fmaxf(sqrtf(ss[0]), 1e-7f);
    for (size_t i = 0; i < rows; i++) {
        for (size_t j = 0; j < cols; j++) { x[tr ? j * rows + i : i * cols + j] = w[i * cols + j] * inv; }
    }
}

// w (rows, cols) = scale x, x transposed back when tr
static void muon_store_cpu(float *w, const float *x, size_t rows, size_t cols, int tr, float scale) {
    for (size_t i = 0; i < rows; i++) {
        for (size_t j = 0; j < cols; j++) { w[i * cols + j] = scale * x[tr ? j * rows + i : i * cols + j]; }
    }
}

#ifdef USE_CUDA
__global__ void muon_momentum_kernel(float *m, float *u, const floatX *g, size_t n, float mu, const float *grad_scale) {
    float s = *grad_scale;
    if (s == 0.0f) { return; }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = (float)g[i] * s;
        float mi = mu * m[i] + (1.0f - mu) * gi;
        m[i] = mi;
        u[i] = (1.0f - mu) * gi + mu * mi;
    }
}

__global__ void muon_apply_kernel(floatX *params, float *master, const float *o, size_t n, float lr, float wd,
                                  const float *grad_scale, unsigned int seed) {
    if (*grad_scale == 0.0f) { return; }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float p = (master != NULL ? master[i] : (float)params[i]) * (1.0f - lr * wd) - lr * o[i];
        if (master != NULL) { master[i] = p; }
        params[i] = float_to_floatX_stochastic(p, random_bits(seed, i));
    }
}

// a thread per slot: its piece by binary search over the pieces' first slots
__global__ void move_pieces_kernel(float *buf, float *data, const MuonPiece *pc, int np, size_t total, int gather) {
    for (size_t s = (size_t)blockIdx.x * blockDim.x + threadIdx.x; s < total; s += (size_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = np - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (pc[mid].slot <= s) { lo = mid; } else { hi = mid - 1; }
        }
        size_t e = piece_element(&pc[lo], s - pc[lo].slot);
        if (gather) { buf[s] = data[e]; } else { data[e] = buf[s]; }
    }
}

// fp32 GEMM in 16 x 16 tiles (Newton-Schulz on matrices of a layer: small; fp32 as the update is specified)
#define MUON_TILE 16
__global__ void __launch_bounds__(MUON_TILE * MUON_TILE) muon_gemm_kernel(float *out, const float *a, const float *b,
                                                                          int M, int N, int K, int bt, float alpha,
                                                                          float beta) {
    __shared__ float as[MUON_TILE][MUON_TILE], bs[MUON_TILE][MUON_TILE + 1];
    int tx = threadIdx.x % MUON_TILE, ty = threadIdx.x / MUON_TILE;
    int row = blockIdx.y * MUON_TILE + ty, col = blockIdx.x * MUON_TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += MUON_TILE) {
        int ka = k0 + tx, kb = k0 + ty;
        as[ty][tx] = row < M && ka < K ? a[(size_t)row * K + ka] : 0.0f;
        int bcol = blockIdx.x * MUON_TILE + tx;   // bs[k][n]
        float bv = 0.0f;
        if (bcol < N && kb < K) { bv = bt ? b[(size_t)bcol * K + kb] : b[(size_t)kb * N + bcol]; }
        bs[ty][tx] = bv;
        __syncthreads();
        for (int k = 0; k < MUON_TILE; k++) { acc += as[ty][k] * bs[k][tx]; }
        __syncthreads();
    }
    if (row < M && col < N) {
        size_t o = (size_t)row * N + col;
        out[o] = alpha * acc + (beta != 0.0f ? beta * out[o] : 0.0f);
    }
}

// ss[0] = sum of w^2, one block (deterministic: a fixed tree)
#define MUON_SS_THREADS 256
__global__ void __launch_bounds__(MUON_SS_THREADS) sum_squares_f32_kernel(float *ss, const float *w, size_t n) {
    __shared__ float part[MUON_SS_THREADS];
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += MUON_SS_THREADS) { s += w[i] * w[i]; }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = MUON_SS_THREADS / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) { part[threadIdx.x] += part[threadIdx.x + h]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { ss[0] = part[0]; }
}

__global__ void muon_load_kernel(float *x, const float *w, const float *ss, size_t rows, size_t cols, int tr) {
    float inv = 1.0f / fmaxf(sqrtf(ss[0]), 1e-7f);
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < rows * cols; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k / cols, j = k % cols;
        x[tr ? j * rows + i : k] = w[k] * inv;
    }
}

__global__ void muon_store_kernel(float *w, const float *x, size_t rows, size_t cols, int tr, float scale) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < rows * cols; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k / cols, j = k % cols;
        w[k] = scale * x[tr ? j * rows + i : k];
    }
}
#endif

static void muon_momentum(float *m, float *u, const floatX *g, size_t n, float mu, const float *grad_scale) {
    if (n == 0) { return; }
#ifdef USE_CUDA
    LAUNCH(muon_momentum_kernel, elementwise_grid(n, 256), 256, 0, main_stream)(m, u, g, n, mu, grad_scale);
    cudaCheckLaunch();
#else
    muon_momentum_cpu(m, u, g, n, mu, grad_scale);
#endif
}

static void muon_apply(floatX *params, float *master, const float *o, size_t n, float lr, float wd,
                       const float *grad_scale, unsigned int seed) {
    if (n == 0) { return; }
#ifdef USE_CUDA
    LAUNCH(muon_apply_kernel, elementwise_grid(n, 256), 256, 0, main_stream)(params, master, o, n, lr, wd, grad_scale,
                                                                             seed);
    cudaCheckLaunch();
#else
    (void)seed;
    muon_apply_cpu(params, master, o, n, lr, wd, grad_scale);
#endif
}

static void move_pieces(float *buf, float *data, const MuonMove *mv, int gather) {
    if (mv->total == 0) { return; }
#ifdef USE_CUDA
    LAUNCH(move_pieces_kernel, elementwise_grid(mv->total, 256), 256, 0, main_stream)(buf, data, mv->pieces,
                                                                                     mv->npieces, mv->total, gather);
    cudaCheckLaunch();
#else
    move_pieces_cpu(buf, data, mv->pieces, mv->npieces, gather);
#endif
}

static void muon_gemm(float *out, const float *a, const float *b, int M, int N, int K, int bt, float alpha, float beta) {
#ifdef USE_CUDA
    dim3 grid(ceil_div(N, MUON_TILE), ceil_div(M, MUON_TILE));
    LAUNCH(muon_gemm_kernel, grid, MUON_TILE * MUON_TILE, 0, main_stream)(out, a, b, M, N, K, bt, alpha, beta);
    cudaCheckLaunch();
#else
    muon_gemm_cpu(out, a, b, M, N, K, bt, alpha, beta);
#endif
}

static void sum_squares_f32(float *ss, const float *w, size_t n) {
#ifdef USE_CUDA
    LAUNCH(sum_squares_f32_kernel, 1, MUON_SS_THREADS, 0, main_stream)(ss, w, n);
    cudaCheckLaunch();
#else
    sum_squares_f32_cpu(ss, w, n);
#endif
}

static void muon_load(float *x, const float *w, const float *ss, size_t rows, size_t cols, int tr) {
#ifdef USE_CUDA
    LAUNCH(muon_load_kernel, elementwise_grid(rows * cols, 256), 256, 0, main_stream)(x, w, ss, rows, cols, tr);
    cudaCheckLaunch();
#else
    muon_load_cpu(x, w, ss, rows, cols, tr);
#endif
}

static void muon_store(float *w, const float *x, size_t rows, size_t cols, int tr, float scale) {
#ifdef USE_CUDA
    LAUNCH(muon_store_kernel, elementwise_grid(rows * cols, 256), 256, 0, main_stream)(w, x, rows, cols, tr, scale);
    cudaCheckLaunch();
#else
    muon_store_cpu(w, x, rows, cols, tr, scale);
#endif
}

// ----------------------------------------------------------------------------
// Newton-Schulz on one matrix w (rows, cols), in place: U in, 0.2 sqrt(max(rows, cols)) O out

static void newton_schulz(Muon *mu, float *w, size_t rows, size_t cols) {
    int tr = rows > cols;
    int m = (int)(tr ? cols : rows), n = (int)(tr ? rows : cols);   // x (m, n), m <= n
    float *x = mu->x, *y = mu->y;
    sum_squares_f32(mu->ss, w, rows * cols);
    muon_load(x, w, mu->ss, rows, cols, tr);
    for (int k = 0; k < MUON_NS_STEPS; k++) {
        muon_gemm(mu->s, x, x, m, m, n, 1, 1.0f, 0.0f);                              // S = X X^T (m, m)
        copy_on_device(mu->t, mu->s, (size_t)m * m * sizeof(float));
        muon_gemm(mu->t, mu->s, mu->s, m, m, m, 1, MUON_C, MUON_B);                   // T = b S + c S S^T (S symmetric)
        copy_on_device(y, x, (size_t)m * n * sizeof(float));
        muon_gemm(y, mu->t, x, m, n, m, 0, 1.0f, MUON_A);                             // Y = a X + T X
        float *swap = x; x = y; y = swap;
    }
    muon_store(w, x, rows, cols, tr, 0.2f * sqrtf((float)(rows > cols ? rows : cols)));
    mu->ns_calls++;
}

// ----------------------------------------------------------------------------
// the step

// After zero_finish_grads and the clip scale (zero.h, global_norm.h): the Muon elements of every owned range are
// updated; zero_optimizer_step then runs AdamW on the rest and (stages 1-2) gathers the shards.
static void muon_step(Muon *mu, float lr, float weight_decay, const float *grad_scale, unsigned int seed) {
    for (int r = 0; r < mu->nrun; r++) {
        MuonRun *q = &mu->run[r];
        muon_momentum(q->m, mu->u + q->h, q->grad, q->len, mu->momentum, grad_scale);
    }
    move_pieces(mu->sendbuf, mu->u, &mu->send, 1);
    comm_all_to_allv(mu->world, mu->sendbuf, mu->send.counts, mu->send.offsets, mu->recvbuf, mu->recv.counts,
                     mu->recv.offsets, DT_FLOAT);   // U to the owners
    move_pieces(mu->recvbuf, mu->mats, &mu->recv, 0);
    for (int i = 0; i < mu->nmat; i++) {
        const MuonMatrix *a = &mu->mat[i];
        if (a->owner == mu->world->rank) { newton_schulz(mu, mu->mats + a->at, a->rows, a->cols); }
    }
    move_pieces(mu->sendbuf, mu->mats, &mu->serve, 1);
    comm_all_to_allv(mu->world, mu->sendbuf, mu->serve.counts, mu->serve.offsets, mu->recvbuf, mu->need.counts,
                     mu->need.offsets, DT_FLOAT);   // the results back
    move_pieces(mu->recvbuf, mu->u, &mu->need, 0);
    for (int r = 0; r < mu->nrun; r++) {
        MuonRun *q = &mu->run[r];
        muon_apply(q->param, q->master, mu->u + q->h, q->len, lr, weight_decay, grad_scale, seed + q->seed);
    }
}

// ----------------------------------------------------------------------------
// set-up: the matrices, their owners, where every element goes

static int muon_tensor_in_layer(const ModelConfig *c, int id, int l) {
    TensorSpec s = tensor_spec(c, id);
    if (s.layers <= 0 || s.rows * s.cols == 0) { return 0; }
    if (id == T_FCW || id == T_FCPROJW) { return !is_moe_layer(c, l); }
    if (is_moe_tensor(id)) { return is_moe_layer(c, l); }
    return 1;
}

static size_t muon_part_rows(const TensorSpec *s, int part) {
    if (s->split != SPLIT_QKV) { return s->rows; }
    return part == 0 ? s->qrows : (s->rows - s->qrows) / 2;
}

// Every Muon matrix of the model in one order (tensor, layer, block, part), the same on every rank; base[id * L + l]:
// the index of (id, l)'s first (-1: none).
static int muon_list(const ModelConfig *c, MuonMatrix *out, int *base) {
    int n = 0, L = c->num_layers;
    for (int id = 0; id < NUM_TENSORS; id++) {
        for (int l = 0; l < L; l++) {
            base[id * L + l] = -1;
            if (!muon_tensor(id) || !muon_tensor_in_layer(c, id, l)) { continue; }
            TensorSpec s = tensor_spec(c, id);
            int parts = s.split == SPLIT_QKV ? 3 : 1;
            base[id * L + l] = n;
            for (int b = 0; b < s.nblk; b++) {
                for (int p = 0; p < parts; p++) {
                    if (out) { out[n] = (MuonMatrix){id, l, b, p, muon_part_rows(&s, p), s.cols, -1, 0}; }
                    n++;
                }
            }
        }
    }
    return n;
}

// The pipeline stage that holds layer l (first: the layer split, layer_split's).
static int muon_layer_stage(const int *first, int pp, int vpp, int l) {
    for (int st = 0; st < pp; st++) {
        for (int v = 0; v < vpp; v++) {
            int l0, l1;
            chunk_layers(first, pp, st, v, &l0, &l1);
            if (l >= l0 && l < l1) { return st; }
        }
    }
    return -1;
}

// Whether world rank r holds (a part of) matrix a: its stage holds the layer, and for an expert's matrix its ep rank
// holds the expert (grid.h's rank order: tp fastest, then cp, pp, dp; ep_rank = dp_rank % ep). Every tp, cp and dp
// rank of that stage (and ep rank) holds a part, or (ZeRO) holds it in the sense of being one of its replicas.
static int muon_holds(const ModelConfig *c, const Grid *g, const MuonMatrix *a, int stage, int r) {
    int pp_rank = r / (g->tp * g->cp) % g->pp, dp_rank = r / (g->tp * g->cp * g->pp);
    if (pp_rank != stage) { return 0; }
    if (!is_moe_tensor(a->id)) { return 1; }
    TensorSpec s = tensor_spec(c, a->id);
    if (!s.experts) { return 1; }   // (the shared experts: on every ep rank)
    return dp_rank % g->ep == a->blk / (s.nblk / g->ep);
}

// The matrices' owners, from the layout alone (so a memory plan of any rank knows them): largest Newton-Schulz cost
// first, each to the holder with the least cost so far (ties: the lower rank). Sets owner and at.
static void muon_assign(Muon *mu, const ModelConfig *c, const Grid *g, const int *first, int vpp) {
    int W = g->world_size;
    double *load = (double *)calloc_check(W, sizeof(double)), *cost = (double *)malloc_check((mu->nmat + 1) * sizeof(double));
    int *order = (int *)malloc_check((mu->nmat + 1) * sizeof(int));
    for (int i = 0; i < mu->nmat; i++) {
        double m = (double)(mu->mat[i].rows < mu->mat[i].cols ? mu->mat[i].rows : mu->mat[i].cols);
        double n = (double)(mu->mat[i].rows < mu->mat[i].cols ? mu->mat[i].cols : mu->mat[i].rows);
        cost[i] = MUON_NS_STEPS * (4.0 * m * m * n + 2.0 * m * m * m);
        order[i] = i;
    }
    for (int i = 1; i < mu->nmat; i++) {   // (insertion sort: stable, by cost descending)
        int k = order[i], j = i;
        while (j > 0 && cost[order[j - 1]] < cost[k]) { order[j] = order[j - 1]; j--; }
        order[j] = k;
    }
    for (int i = 0; i < mu->nmat; i++) {
        MuonMatrix *a = &mu->mat[order[i]];
        int best = -1, stage = muon_layer_stage(first, g->pp, vpp, a->layer);
        for (int r = 0; r < W; r++) {
            if (muon_holds(c, g, a, stage, r) && (best < 0 || load[r] < load[best])) { best = r; }
        }
        if (best < 0) { fail("Muon: matrix %s of layer %d is held by no rank: a bug", tensor_names[a->id], a->layer); }
        a->owner = best;
        load[best] += cost[order[i]];
    }
    size_t *size = (size_t *)calloc_check(W, sizeof(size_t));
    for (int k = 0; k < mu->nmat; k++) {
        MuonMatrix *a = &mu->mat[k];
        a->at = size[a->owner];
        size[a->owner] += a->rows * a->cols;
    }
    mu->mats_size = size[g->rank];
    free(load); free(cost); free(order); free(size);
}

// A rank's place for the walk below: its tp rank and ep rank, and per unit the range [start, start + len) it walks
// (its shard partition: what it sends; or its owned range: what it updates).
typedef struct { int tp_rank, ep_rank; size_t *start, *len; } MuonRank;

// The group rank of world rank r in unit U's data-parallel group (grid.h's order, members by world rank: dp x cp for
// the dense units, (dp / ep) x cp for the experts').
static int muon_dp_rank(const Grid *g, const Unit *U, int r) {
    int cp_rank = r / g->tp % g->cp, dp_rank = r / (g->tp * g->cp * g->pp);
    if (U->dpg == &g->edp_group) { return dp_rank / g->ep * g->cp + cp_rank; }
    return g->cp > 1 ? dp_rank * g->cp + cp_rank : dp_rank;
}

// Rank r's ranges: its shard partition of each unit (updates = 0), or what it updates (1: the whole unit at ZeRO 0).
static MuonRank muon_rank(const Zero *z, int r, int updates) {
    const Grid *g = z->grid;
    MuonRank k = {r % g->tp, r / (g->tp * g->cp * g->pp) % g->ep, NULL, NULL};
    k.start = (size_t *)calloc_check(z->nunits + 1, sizeof(size_t));
    k.len = (size_t *)calloc_check(z->nunits + 1, sizeof(size_t));
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        size_t s0 = (size_t)muon_dp_rank(g, U, r) * U->shard, e = s0 + U->shard < U->size ? s0 + U->shard : U->size;
        if (updates && z->stage == 0) { s0 = 0; e = U->size; }
        k.start[u] = s0;
        k.len[u] = e > s0 ? e - s0 : 0;
    }
    return k;
}

// The piece of matrix elements starting at element o of a rank's copy of tensor T (tp rank tp_rank): its matrix (mi),
// the end of the local region it lies in (a block, or Llama's q, k, v rows), and where it sits in the matrix (base,
// phase, w, S of MuonPiece, the matrix's offset not added).
static void muon_geometry(const ModelConfig *c, const UnitTensor *T, const int *base, int tp, int tp_rank, size_t o,
                          int *mi, size_t *end, MuonPiece *pc) {
    TensorSpec s = tensor_spec(c, T->id);
    int parts = s.split == SPLIT_QKV ? 3 : 1;
    size_t first = (size_t)base[T->id * c->num_layers + T->layer];
    pc->phase = 0; pc->w = 1; pc->S = 1;
    if (s.split == SPLIT_COLS) {   // [blocks][rows][cols/tp]: rows of w = cols/tp, S = cols apart
        size_t lc = s.cols / tp, blk = s.rows * lc, lb = o / blk, rel = o % blk;
        *mi = (int)(first + (T->blk0 + lb) * parts);
        *end = (lb + 1) * blk;
        pc->base = rel / lc * s.cols + (size_t)tp_rank * lc;
        pc->phase = rel % lc; pc->w = lc; pc->S = s.cols;
    } else if (s.split == SPLIT_QKV) {   // [q rows / tp | k rows / tp | v rows / tp] x cols
        size_t ql = s.qrows / tp, kl = (s.rows - s.qrows) / 2 / tp, lr = o / s.cols;
        int part = lr < ql ? 0 : lr < ql + kl ? 1 : 2;
        size_t r0 = part == 0 ? 0 : part == 1 ? ql : ql + kl, per = part == 0 ? ql : kl;
        *mi = (int)(first + part);
        *end = (r0 + per) * s.cols;
        pc->base = ((size_t)tp_rank * per + lr - r0) * s.cols + o % s.cols;
    } else {   // SPLIT_ROWS: [blocks][rows / tp] x cols
        size_t lrows = s.rows / tp, blk = lrows * s.cols, lb = o / blk, rel = o % blk;
        *mi = (int)(first + (T->blk0 + lb) * parts);
        *end = (lb + 1) * blk;
        pc->base = (size_t)tp_rank * lrows * s.cols + rel;
    }
}

// Walks rank k's ranges of Muon's tensors (units in order, tensors in order), cut into pieces at the matrices'
// bounds: each piece's matrix (mi[i]), its place in that matrix (pc[i]: base, phase, w, S), its length (pc[i].n) and
// its first element's index h in the rank's list of updated elements (pc[i].slot; meaningful for this rank's own
// walks). Skips an experts' unit of another ep rank (other experts). Returns the number of pieces; NULL out: counts.
static int muon_walk(const Zero *z, const ModelConfig *c, const int *base, const MuonRank *k, int *mi, MuonPiece *pc) {
    int n = 0, tp = z->grid->tp;
    for (int u = 0; u < z->nunits; u++) {
        const Unit *U = &z->units[u];
        if (U->dpg == &z->grid->edp_group && k->ep_rank != z->grid->ep_rank) { continue; }
        size_t a, b, ustart, ulen;
        zero_owned_range(z, u, &ustart, &ulen);
        for (int t = 0; t < U->ntensors; t++) {
            const UnitTensor *T = &U->t[t];
            if (!T->muon || !tensor_overlap(T, k->start[u], k->start[u] + k->len[u], &a, &b)) { continue; }
            for (size_t e = a; e < b;) {
                int m;
                size_t end;
                MuonPiece p;
                muon_geometry(c, T, base, tp, k->tp_rank, e - T->offset, &m, &end, &p);
                size_t stop = T->offset + end < b ? T->offset + end : b;
                if (pc) {
                    // h: this rank's Muon elements before e (zero.h's order: units, then tensors)
                    size_t h = U->muon_before, x, y;
                    for (int q = 0; q < U->ntensors; q++) {
                        if (U->t[q].muon && tensor_overlap(&U->t[q], ustart, e, &x, &y)) { h += y - x; }
                    }
                    p.slot = h;
                    p.n = stop - e;
                    pc[n] = p;
                    mi[n] = m;
                }
                n++;
                e = stop;
            }
        }
    }
    return n;
}

// Rank k's pieces (walked as above), all of them or those of the matrices `owner` owns (-1: any).
static int muon_rank_pieces(const Muon *mu, const Zero *z, const ModelConfig *c, const int *base, const MuonRank *k,
                            int owner, int **mi, MuonPiece **pc) {
    int n = muon_walk(z, c, base, k, NULL, NULL);
    *mi = (int *)malloc_check((n + 1) * sizeof(int));
    *pc = (MuonPiece *)malloc_check((n + 1) * sizeof(MuonPiece));
    muon_walk(z, c, base, k, *mi, *pc);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (owner >= 0 && mu->mat[(*mi)[i]].owner != owner) { continue; }
        (*mi)[kept] = (*mi)[i];
        (*pc)[kept++] = (*pc)[i];
    }
    return kept;
}

// One direction's move, as this rank sees it, uploaded (device pieces, host counts):
//   holder (as_owner 0): this rank's pieces (its shard partition's, or what it updates), grouped by owner; slots in
//     owner order, elements in u (contiguous: base h);
//   owner (1): for every rank in order, that rank's pieces of the matrices this rank owns; elements in the matrices.
static void muon_move_init(Muon *mu, const Zero *z, const ModelConfig *c, const int *base, int updates, int as_owner,
                           MuonMove *mv) {
    int W = mu->world->size, me = mu->world->rank, cap = 16, np = 0;
    MuonPiece *all = (MuonPiece *)malloc_check(cap * sizeof(MuonPiece));
    mv->counts = (size_t *)calloc_check(W, sizeof(size_t));
    mv->offsets = (size_t *)calloc_check(W, sizeof(size_t));
    size_t slot = 0;
    const Grid *g = z->grid;
    for (int r = 0; r < W; r++) {   // peer r: the owner sent to (holder), or the rank received from (owner)
        mv->offsets[r] = slot;
        if (as_owner && r / (g->tp * g->cp) % g->pp != g->pp_rank) { continue; }   // (another stage: other layers)
        MuonRank k = muon_rank(z, as_owner ? r : me, updates);
        int *mi;
        MuonPiece *pc;
        int n = muon_rank_pieces(mu, z, c, base, &k, as_owner ? me : r, &mi, &pc);
        for (int i = 0; i < n; i++) {
            if (np == cap) { cap *= 2; all = (MuonPiece *)realloc_check(all, cap * sizeof(MuonPiece)); }
            MuonPiece p = pc[i];
            if (as_owner) { p.base += mu->mat[mi[i]].at; }   // (in the owner's buffer)
            else { p.base = p.slot; p.phase = 0; p.w = 1; p.S = 1; }   // (in u: contiguous from h)
            p.slot = slot;
            slot += p.n;
            all[np++] = p;
        }
        mv->counts[r] = slot - mv->offsets[r];
        free(mi); free(pc); free(k.start); free(k.len);
    }
    mv->total = slot;
    mv->npieces = np;
    mv->pieces = (MuonPiece *)mem_alloc((np + 1) * sizeof(MuonPiece), MEM_COMM);
    if (!mem_planning && np > 0) { copy_to_device(mv->pieces, all, np * sizeof(MuonPiece)); }
    free(all);
}

// The counts each rank derived for the other side agree with that side's own (once, at set-up): a check of the walks.
static void muon_check_counts(Muon *mu, const MuonMove *from, const MuonMove *to, const char *what) {
    int W = mu->world->size;
    int *mine = (int *)calloc_check(W, sizeof(int)), *all = (int *)malloc_check((size_t)W * W * sizeof(int));
    for (int r = 0; r < W; r++) { mine[r] = (int)from->counts[r]; }
    comm_host_all_gather(mu->world, mine, W, all, DT_INT, "all-gather (Muon's element counts)");
    for (int r = 0; r < W; r++) {
        if ((size_t)all[(size_t)r * W + mu->world->rank] != to->counts[r]) {
            fail("Muon: %s: rank %d sends %d elements to rank %d, which expects %zu: a bug", what, r,
                 all[(size_t)r * W + mu->world->rank], mu->world->rank, to->counts[r]);
        }
    }
    free(mine); free(all);
}

// The Muon runs of this rank: each tensor's part of each unit's owned range (the elementwise kernels' arguments).
static void muon_runs(Muon *mu, Zero *z) {
    for (int pass = 0; pass < 2; pass++) {   // count, then fill
        size_t h = 0;
        int nrun = 0;
        for (int u = 0; u < z->nunits; u++) {
            Unit *U = &z->units[u];
            size_t start, len, a, b;
            zero_owned_range(z, u, &start, &len);
            for (int k = 0; k < U->ntensors; k++) {
                UnitTensor *T = &U->t[k];
                if (!T->muon || !tensor_overlap(T, start, start + len, &a, &b)) { continue; }
                if (pass == 1) {
                    size_t o = zero_owned_state(z, u, a);
                    mu->run[nrun] = (MuonRun){zero_owned_param(z, u, a), z->master ? z->master + o : NULL, z->m + o,
                                              zero_owned_grad(z, u, a), b - a, h,
                                              1000003u * (unsigned)(T->id * 4096 + T->layer + 1) + (unsigned)(a - T->offset)};
                }
                h += b - a;
                nrun++;
            }
        }
        if (pass == 0) {
            mu->nrun = nrun;
            mu->n = h;
            mu->run = (MuonRun *)calloc_check(nrun > 0 ? nrun : 1, sizeof(MuonRun));
        }
    }
}

// Sets up Muon over zero.h's units (their tensors marked muon), for a run or (mem_planning) a memory plan, which
// allocates the same sizes and sends nothing: every rank works out every move from the layout alone.
// first, vpp: the layer split (the owners' stages).
static void muon_init(Muon *mu, Zero *z, Grid *grid, const ModelConfig *c, const int *first, int vpp, float momentum) {
    memset(mu, 0, sizeof(*mu));
    mu->momentum = momentum;
    mu->world = &grid->world;
    int L = c->num_layers, me = grid->rank;
    int *base = (int *)malloc_check((size_t)NUM_TENSORS * L * sizeof(int));
    mu->nmat = muon_list(c, NULL, base);
    mu->mat = (MuonMatrix *)calloc_check(mu->nmat > 0 ? mu->nmat : 1, sizeof(MuonMatrix));
    muon_list(c, mu->mat, base);
    muon_assign(mu, c, grid, first, vpp);
    for (int i = 0; i < mu->nmat; i++) { mu->owned += mu->mat[i].owner == me; }
    for (int u = 0; u < z->nunits && !mem_planning; u++) {   // (the walks' group ranks are the groups' own)
        if (muon_dp_rank(grid, &z->units[u], me) != z->units[u].dpg->rank) {
            fail("Muon: rank %d is rank %d of its %s group, the grid's order says %d: a bug", me, z->units[u].dpg->rank,
                 z->units[u].dpg->name, muon_dp_rank(grid, &z->units[u], me));
        }
    }
    muon_runs(mu, z);
    muon_move_init(mu, z, c, base, 0, 0, &mu->send);    // U: this rank's shard partition, to the owners
    muon_move_init(mu, z, c, base, 0, 1, &mu->recv);    //    every rank's, of this rank's matrices
    muon_move_init(mu, z, c, base, 1, 1, &mu->serve);   // the results: to every rank that updates them
    muon_move_init(mu, z, c, base, 1, 0, &mu->need);    //    into what this rank updates
    if (!mem_planning) {
        muon_check_counts(mu, &mu->send, &mu->recv, "U to the owners");
        muon_check_counts(mu, &mu->serve, &mu->need, "the results back");
    }
    mu->nsend = mu->send.total; mu->nrecv = mu->recv.total; mu->nserve = mu->serve.total;
    if (mu->nrecv != mu->mats_size || mu->need.total != mu->n) {
        fail("Muon: rank %d receives %zu elements of its %zu and %zu of the %zu it updates: a bug", me, mu->nrecv,
             mu->mats_size, mu->need.total, mu->n);
    }
    // what leaves the rank: its sends but those to itself; what it serves but what it keeps
    mu->out = (double)(mu->nsend - mu->send.counts[me]) + (double)(mu->nserve - mu->serve.counts[me]);
    size_t sb = mu->nsend > mu->nserve ? mu->nsend : mu->nserve, rb = mu->nrecv > mu->n ? mu->nrecv : mu->n;
    mu->u = (float *)mem_alloc((mu->n + 1) * sizeof(float), MEM_WORKSPACE);
    mu->sendbuf = (float *)mem_alloc((sb + 1) * sizeof(float), MEM_COMM);
    mu->recvbuf = (float *)mem_alloc((rb + 1) * sizeof(float), MEM_COMM);
    mu->mats = (float *)mem_alloc((mu->mats_size + 1) * sizeof(float), MEM_WORKSPACE);
    size_t work = 1, sq = 1;
    for (int i = 0; i < mu->nmat; i++) {
        const MuonMatrix *a = &mu->mat[i];
        size_t m = a->rows < a->cols ? a->rows : a->cols;
        if (a->owner != me) { continue; }
        if (a->rows * a->cols > work) { work = a->rows * a->cols; }
        if (m * m > sq) { sq = m * m; }
    }
    mu->work = work;
    mu->x = (float *)mem_alloc(work * sizeof(float), MEM_WORKSPACE);
    mu->y = (float *)mem_alloc(work * sizeof(float), MEM_WORKSPACE);
    mu->s = (float *)mem_alloc(sq * sizeof(float), MEM_WORKSPACE);
    mu->t = (float *)mem_alloc(sq * sizeof(float), MEM_WORKSPACE);
    mu->ss = (float *)mem_alloc(sizeof(float), MEM_WORKSPACE);
    free(base);
}

// The Newton-Schulz runs of one step, summed over the world (--check-comm: equals nmat).
static double muon_ns_calls_world(Muon *mu, long before) {
    double mine = (double)(mu->ns_calls - before);
    comm_host_all_reduce(mu->world, &mine, 1, DT_DOUBLE, HOST_SUM, "all-reduce (Muon's Newton-Schulz count)");
    return mine;
}

#endif
