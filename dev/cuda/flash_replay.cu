// The flash attention kernels (llmc/flash_attention.h) replayed on the CPU, thread by thread: each block's
// 128 threads are CPU threads running the kernels' own bodies, and the four warp operations are emulated
// from the PTX ISA's description: fa_sync a barrier of the block; fa_shfl_xor an exchange through memory (a barrier of the warp's lanes);
// fa_ldmatrix_x4 gathers the warp's 32 row addresses and hands lane (g, t) row g, columns 2t, 2t + 1 of each
// of the four 8 x 8 matrices (with trans: column g, rows 2t, 2t + 1); fa_cp_async16 fills its 16 shared
// bytes with NaN at once and copies the data only when this thread's wait retires its group (the latest
// moment the PTX allows: a read before the wait and barrier, or a refill of a buffer still being read, sees NaN);
// fa_mma rebuilds the warp's A (16 x 16) and B (16 x 8) from every lane's registers ("Matrix Fragments for
// mma.m16n8k16": a_i at row g (+8 for a2, a3, a6, a7), column 2t + (i & 1) (+8 for a4..a7); b_i at row
// 2t + (i & 1) (+8 for b2, b3), column g; c_i at row g (+8 for c2, c3), column 2t + (i & 1)) and computes this
// lane's four outputs. Checks the tiling, the masking, the online softmax and the fragment bookkeeping
// against attention_forward_cpu / attention_backward_cpu without a GPU. bf16 build: inputs rounded to
// bf16; an indexing or masking error gives errors of the size of the outputs themselves.
// Build and run (no GPU needed): make -C dev/cuda flash-replay
#include "../../llmc/attention.h"
#include "../../llmc/context_parallel.h"   // (the ring blocks' CPU loops)
#include <pthread.h>
#include <thread>
#include <atomic>
#include <vector>

static pthread_barrier_t emu_barrier, emu_warp_barrier[FA_WARPS];
static thread_local int emu_tid;
static float emu_f[FA_THREADS];
static uint32_t emu_a[FA_THREADS][4], emu_b[FA_THREADS][2];

static void emu_sync(void) { pthread_barrier_wait(&emu_barrier); }
// a warp operation's exchange waits for the warp's 32 lanes only (the block's other warps run on: a missing
// fa_sync between warps is a race here too)
static void emu_warp_sync(void) { pthread_barrier_wait(&emu_warp_barrier[emu_tid / 32]); }
static float emu_shfl_xor(float v, int mask) {
    emu_f[emu_tid] = v;
    emu_warp_sync();
    float r = emu_f[(emu_tid & ~31) | ((emu_tid & 31) ^ mask)];
    emu_warp_sync();
    return r;
}
static float bf16_bits(uint32_t h) { uint32_t u = h << 16; float f; memcpy(&f, &u, 4); return f; }   // bf16 -> fp32, exact
static float bf16_lo(uint32_t r) { return bf16_bits(r & 0xffffu); }
static float bf16_hi(uint32_t r) { return bf16_bits(r >> 16); }
typedef struct { void *dst; const void *src; int bytes; } EmuCopy;
static thread_local std::vector<std::vector<EmuCopy>> emu_groups;   // committed, not yet waited for
static thread_local std::vector<EmuCopy> emu_open;                   // issued since the last commit
static std::atomic<long> emu_unwaited(0);                            // copies a block never waited for
static int emu_cp_mutation = 0;   // (--mutate-cp-wait: each wait retires one group fewer than it should)
static void emu_cp_async(void *dst, const void *src, int bytes) {
    uint16_t nan16[8];
    for (int i = 0; i < 8; i++) { nan16[i] = 0x7fc0; }   // bf16 NaN
    memcpy(dst, nan16, 16);
    emu_open.push_back({dst, src, bytes});
}
static void emu_cp_commit(void) { emu_groups.push_back(emu_open); emu_open.clear(); }
static void emu_cp_wait(int pending) {
    if (emu_cp_mutation) { pending++; }
    while ((int)emu_groups.size() > pending) {
        for (const EmuCopy &c : emu_groups.front()) {
            if (c.bytes == 16) { memcpy(c.dst, c.src, 16); } else { memset(c.dst, 0, 16); }
        }
        emu_groups.erase(emu_groups.begin());
    }
}
static const floatX *emu_rows[FA_THREADS];
static int emu_ldmatrix_mutation = 0;   // (--mutate-ldmatrix: the transposed load's rows and columns swapped back)
static void emu_ldmatrix(uint32_t r[4], const void *row, int trans) {
    emu_rows[emu_tid] = (const floatX *)row;
    emu_warp_sync();
    int w = emu_tid & ~31, lane = emu_tid & 31, g = lane / 4, t = lane % 4;
    if (emu_ldmatrix_mutation) { trans = !trans; }
    for (int j = 0; j < 4; j++) {
        const floatX *const *m = emu_rows + w + 8 * j;   // matrix j's rows 0..7
        r[j] = trans ? fa_bits2(m[2 * t][g], m[2 * t + 1][g]) : fa_bits2(m[g][2 * t], m[g][2 * t + 1]);
    }
    emu_warp_sync();
}
static void emu_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    memcpy(emu_a[emu_tid], a, sizeof(emu_a[0]));
    memcpy(emu_b[emu_tid], b, sizeof(emu_b[0]));
    emu_warp_sync();
    int w = emu_tid & ~31, lane = emu_tid & 31, g = lane / 4, t = lane % 4;
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int gl = L / 4, tl = L % 4;
        const uint32_t *ra = emu_a[w + L], *rb = emu_b[w + L];
        A[gl][2 * tl] = bf16_lo(ra[0]);         A[gl][2 * tl + 1] = bf16_hi(ra[0]);
        A[gl + 8][2 * tl] = bf16_lo(ra[1]);     A[gl + 8][2 * tl + 1] = bf16_hi(ra[1]);
        A[gl][2 * tl + 8] = bf16_lo(ra[2]);     A[gl][2 * tl + 9] = bf16_hi(ra[2]);
        A[gl + 8][2 * tl + 8] = bf16_lo(ra[3]); A[gl + 8][2 * tl + 9] = bf16_hi(ra[3]);
        B[2 * tl][gl] = bf16_lo(rb[0]);         B[2 * tl + 1][gl] = bf16_hi(rb[0]);
        B[2 * tl + 8][gl] = bf16_lo(rb[1]);     B[2 * tl + 9][gl] = bf16_hi(rb[1]);
    }
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) { acc += A[row][k] * B[k][col]; }
        c[e] += acc;
    }
    emu_warp_sync();
}

// runs body(tid) on FA_THREADS CPU threads, as one block; counts the copies a thread issued and never waited for
template <typename F>
static void run_block(F body) {
    std::vector<std::thread> threads;
    for (int tid = 0; tid < FA_THREADS; tid++) {
        threads.emplace_back([&, tid] {
            emu_tid = tid;
            body(tid);
            long left = (long)emu_open.size();
            for (const auto &grp : emu_groups) { left += (long)grp.size(); }
            emu_unwaited += left;
        });
    }
    for (auto &th : threads) { th.join(); }
}

static float *rounded_random(size_t n, unsigned int *seed) {
    float *x = (float *)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)(floatX)(((*seed >> 8) / 16777216.0f) * 2.0f - 1.0f);
    }
    return x;
}
static floatX *to_bf16(const float *x, size_t n) {
    floatX *y = (floatX *)aligned_alloc(64, (n * sizeof(floatX) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) { y[i] = (floatX)x[i]; }
    return y;
}

static int fails = 0;
template <typename X>
static void compare(const char *what, const X *got, const float *want, size_t n, int B, int T, int NH, int KV, int hs) {
    double worst = 0.0, sq = 0.0, ref = 0.0;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)(float)got[i], w = want[i], err = fabs(g - w), allowed = 1e-2 + 2e-2 * fabs(w);
        sq += err * err; ref += w * w;
        if (!(err <= allowed)) { bad++; }
        if (!(err / allowed <= worst)) { worst = err / allowed; at = i; }
    }
    printf("%-4s flash replay B%d T%d NH%d KV%d (hs %d): %-14s %zu of %zu beyond 1e-2 + 2e-2|ref| (worst err/allowed %.3f at %zu), rms err / rms %.2e\n",
           bad ? "FAIL" : "ok", B, T, NH, KV, hs, what, bad, n, worst, at, sqrt(sq / (ref + 1e-30)));
    fails += bad > 0;
}

// One-device attention, NH query heads sharing KV kv heads (grouped-query: query head h reads kv head h / (NH / KV))
template <int HS>
static void run_case(int B, int T, int NH, int KV) {
    int W = (NH + 2 * KV) * HS, C = NH * HS;
    unsigned int seed = 99u + T + 7u * (NH - KV);
    size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = rounded_random(nqkv, &seed), *dout = rounded_random(nout, &seed);
    float *out = (float *)malloc(nout * sizeof(float)), *lse = (float *)malloc(nlse * sizeof(float)), *dqkv = (float *)malloc(nqkv * sizeof(float));
    attention_forward_cpu(out, lse, qkv, B, T, NH, KV, HS);
    for (size_t i = 0; i < nout; i++) { out[i] = (float)(floatX)out[i]; }   // the backward reads out as stored
    attention_backward_cpu(dqkv, dout, qkv, out, lse, B, T, NH, KV, HS);
    floatX *x_qkv = to_bf16(qkv, nqkv), *x_dout = to_bf16(dout, nout), *x_outc = to_bf16(out, nout);
    floatX *g_out = (floatX *)aligned_alloc(64, nout * sizeof(floatX) + 64), *g_dqkv = (floatX *)aligned_alloc(64, nqkv * sizeof(floatX) + 64);
    float *g_lse = (float *)malloc(nlse * sizeof(float));
    for (size_t i = 0; i < nout; i++) { g_out[i] = (floatX)NAN; }   // every element must be written
    for (size_t i = 0; i < nqkv; i++) { g_dqkv[i] = (floatX)NAN; }
    for (size_t i = 0; i < nlse; i++) { g_lse[i] = NAN; }
    size_t smem_bytes = fa_dq_smem<HS>();   // (the largest: the forward's and dK/dV's are smaller)
    unsigned char *smem = (unsigned char *)aligned_alloc(64, (smem_bytes + 63) / 64 * 64);
    int nq = ceil_div(T, FA_TILE);
    FaArgs fwd = fa_args_full(x_qkv, g_out, g_lse, T, NH, KV, HS), bwd = fa_args_full(x_qkv, x_outc, lse, T, NH, KV, HS);
    bwd.dout = x_dout; bwd.dq = g_dqkv; bwd.dk = g_dqkv + C; bwd.dv = bwd.dk + KV * HS;
    bwd.dq_ld = bwd.dkv_ld = W; bwd.dq_bs = bwd.dkv_bs = (size_t)T * W;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int bx = 0; bx < nq; bx++) {
                run_block([&](int tid) { flash_forward_body<HS>(smem, bx, h, b, nq, tid, fwd); });
            }
        }
    }
    compare("forward out", g_out, out, nout, B, T, NH, KV, HS);
    compare("forward lse", g_lse, lse, nlse, B, T, NH, KV, HS);
    // the backward from the CPU forward's out (as stored) and lse, as the harness does: D of every row
    // first (its own kernel), then the dK/dV blocks (one per kv head) and the dQ blocks (one per query head)
    float *g_D = (float *)malloc(nlse * sizeof(float));
    for (size_t i = 0; i < nlse; i++) { g_D[i] = NAN; }   // every row's D must be written
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int q = 0; q < T; q++) { flash_row_dot_body<HS>(g_D, x_dout, x_outc, b, h, q, T, NH); }
        }
    }
    bwd.D = g_D;
    for (int b = 0; b < B; b++) {
        for (int bx = 0; bx < nq; bx++) {
            for (int kh = 0; kh < KV; kh++) { run_block([&](int tid) { flash_backward_dkdv_body<HS>(smem, bx, kh, b, tid, bwd); }); }
            for (int h = 0; h < NH; h++) { run_block([&](int tid) { flash_backward_dq_body<HS>(smem, bx, h, b, nq, tid, bwd); }); }
        }
    }
    free(g_D);
    compare("backward dqkv", g_dqkv, dqkv, nqkv, B, T, NH, KV, HS);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(x_qkv); free(x_dout); free(x_outc); free(g_out); free(g_dqkv);
    free(g_lse); free(smem);
}

// Ring attention (context_parallel.h) through the flash bodies: every rank i of N holds chunks i and 2N-1-i of c
// tokens (llmc/context_parallel.h's cp_chunk); at ring step s it holds rank j = i - s's keys and values and adds
// each of its query chunks' attention over each of j's key chunks not in its future (earlier chunks whole, the
// same chunk causally), merged by log-sum-exp; the backward adds dq, and dk, dv into j's buffer. The same blocks
// in the same order run through attention_block_forward_cpu / attention_block_backward_cpu (the specification,
// fp32) and through the flash bodies (bf16 data, merge and add), and the final out, lse, dq, dk, dv are compared.

// One ring case's buffers, per rank r: the inputs qkv (T local rows, (NH + 2KV) HS), dout, and kv (its k and v
// parts, 2 KV HS); the CPU loops' out, lse, dqkv, dkv (fp32); the flash bodies' (g_, bf16 data; x_: inputs as bf16)
typedef struct {
    int B, N, c, T, NH, KV, hs;
    size_t nqkv, nkv, nout, nlse;
    std::vector<float *> qkv, dout, out, lse, dqkv, kv, dkv, g_lse, g_D;
    std::vector<floatX *> x_qkv, x_dout, x_kv, x_out, g_out, g_dqkv, g_dkv;
} RingCase;

static float *ring_zeros(size_t n) { return (float *)calloc(n, sizeof(float)); }
static floatX *ring_xzeros(size_t n) {
    floatX *x = (floatX *)aligned_alloc(64, (n * sizeof(floatX) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) { x[i] = (floatX)0.0f; }
    return x;
}

// the inputs (random, bf16-exact) and the outputs before the first block: out 0, lse -inf, gradients 0
static void ring_alloc(RingCase *rc, int B, int N, int c, int NH, int KV, int hs) {
    *rc = RingCase();
    rc->B = B; rc->N = N; rc->c = c; rc->T = 2 * c; rc->NH = NH; rc->KV = KV; rc->hs = hs;
    size_t rows = (size_t)B * rc->T, W = (size_t)(NH + 2 * KV) * hs, W2 = (size_t)2 * KV * hs;
    rc->nqkv = rows * W; rc->nkv = rows * W2; rc->nout = rows * NH * hs; rc->nlse = (size_t)B * NH * rc->T;
    unsigned int seed = 7u + (unsigned)(N * c) + 13u * (NH - KV);
    for (int r = 0; r < N; r++) {
        float *qkv = rounded_random(rc->nqkv, &seed), *kv = ring_zeros(rc->nkv);
        for (size_t row = 0; row < rows; row++) { memcpy(kv + row * W2, qkv + row * W + (size_t)NH * hs, W2 * sizeof(float)); }
        rc->qkv.push_back(qkv); rc->kv.push_back(kv); rc->dout.push_back(rounded_random(rc->nout, &seed));
        rc->out.push_back(ring_zeros(rc->nout)); rc->lse.push_back(ring_zeros(rc->nlse));
        rc->dqkv.push_back(ring_zeros(rc->nqkv)); rc->dkv.push_back(ring_zeros(rc->nkv));
        rc->x_qkv.push_back(to_bf16(qkv, rc->nqkv)); rc->x_dout.push_back(to_bf16(rc->dout[r], rc->nout));
        rc->x_kv.push_back(to_bf16(kv, rc->nkv)); rc->x_out.push_back(NULL);
        rc->g_out.push_back(ring_xzeros(rc->nout)); rc->g_dqkv.push_back(ring_xzeros(rc->nqkv));
        rc->g_dkv.push_back(ring_xzeros(rc->nkv));
        rc->g_lse.push_back(ring_zeros(rc->nlse)); rc->g_D.push_back(ring_zeros(rc->nlse));
        for (size_t i = 0; i < rc->nlse; i++) { rc->lse[r][i] = -INFINITY; rc->g_lse[r][i] = -INFINITY; }
    }
}

static void ring_free(RingCase *rc) {
    for (int r = 0; r < rc->N; r++) {
        free(rc->qkv[r]); free(rc->dout[r]); free(rc->out[r]); free(rc->lse[r]); free(rc->dqkv[r]); free(rc->kv[r]);
        free(rc->dkv[r]); free(rc->x_qkv[r]); free(rc->x_dout[r]); free(rc->x_kv[r]); free(rc->x_out[r]);
        free(rc->g_out[r]); free(rc->g_dqkv[r]); free(rc->g_dkv[r]); free(rc->g_lse[r]); free(rc->g_D[r]);
    }
}

// block(i, j, q0, k0, causal) for each (rank i, step s, query chunk qa, key chunk kb) block, in the ring's order
template <typename F>
static void ring_blocks(const RingCase *rc, F block) {
    int N = rc->N, c = rc->c;
    for (int i = 0; i < N; i++) {
        for (int step = 0; step < N; step++) {
            int j = (i - step + N) % N;
            for (int qa = 0; qa < 2; qa++) {
                for (int kb = 0; kb < 2; kb++) {
                    int qc = qa ? 2 * N - 1 - i : i, kc = kb ? 2 * N - 1 - j : j;
                    if (kc <= qc) { block(i, j, qa * c, kb * c, kc == qc); }
                }
            }
        }
    }
}

// the flash bodies' forward block: rank i's query rows from q0 over rank j's keys from k0, merged into g_out, g_lse
static FaArgs ring_args(const RingCase *rc, int i, int j, int q0, int k0, int causal) {
    FaArgs a;
    memset(&a, 0, sizeof(a));
    size_t W = (size_t)(rc->NH + 2 * rc->KV) * rc->hs, W2 = (size_t)2 * rc->KV * rc->hs, C = (size_t)rc->NH * rc->hs;
    a.q = rc->x_qkv[i] + (size_t)q0 * W; a.k = rc->x_kv[j] + (size_t)k0 * W2; a.v = a.k + (size_t)rc->KV * rc->hs;
    a.q_ld = W; a.q_bs = (size_t)rc->T * W; a.kv_ld = W2; a.kv_bs = (size_t)rc->T * W2;
    a.nq = a.nk = rc->c; a.causal = causal; a.NH = rc->NH; a.KV = rc->KV;
    a.out = rc->g_out[i] + (size_t)q0 * C; a.out_ld = C; a.out_bs = (size_t)rc->T * C;
    a.lse = rc->g_lse[i]; a.lse_T = rc->T; a.lse_off = q0; a.merge = 1;
    return a;
}

// ... the backward block: from the CPU's final lse and D, dq added into rank i's g_dqkv, dk, dv into rank j's g_dkv
static FaArgs ring_backward_args(const RingCase *rc, int i, int j, int q0, int k0, int causal) {
    FaArgs a = ring_args(rc, i, j, q0, k0, causal);
    size_t W = (size_t)(rc->NH + 2 * rc->KV) * rc->hs, W2 = (size_t)2 * rc->KV * rc->hs, C = (size_t)rc->NH * rc->hs;
    a.lse = rc->lse[i]; a.merge = 0;
    a.dout = rc->x_dout[i] + (size_t)q0 * C; a.D = rc->g_D[i];
    a.dq = rc->g_dqkv[i] + (size_t)q0 * W; a.dq_ld = W; a.dq_bs = (size_t)rc->T * W;
    a.dk = rc->g_dkv[j] + (size_t)k0 * W2; a.dv = a.dk + (size_t)rc->KV * rc->hs; a.dkv_ld = W2; a.dkv_bs = (size_t)rc->T * W2;
    a.add = 1;
    return a;
}

// every block forward, through the loops and through the flash bodies (a block per (query tile, query head, batch))
template <int HS>
static void ring_forward(RingCase *rc, unsigned char *smem) {
    int nt = ceil_div(rc->c, FA_TILE);
    ring_blocks(rc, [&](int i, int j, int q0, int k0, int causal) {
        attention_block_forward_cpu(rc->out[i], rc->lse[i], rc->qkv[i], rc->kv[j], rc->B, rc->T, rc->NH, rc->KV, HS, q0,
                                    k0, rc->c, causal);
        FaArgs a = ring_args(rc, i, j, q0, k0, causal);
        for (int b = 0; b < rc->B; b++) {
            for (int h = 0; h < rc->NH; h++) {
                for (int bx = 0; bx < nt; bx++) { run_block([&](int tid) { flash_forward_body<HS>(smem, bx, h, b, nt, tid, a); }); }
            }
        }
    });
}

// rank r's out and lse compared; then its out as stored (bf16) and the D of its rows for the backward, as one would
// from the device's
template <int HS>
static void ring_check_forward(RingCase *rc, int r) {
    char what[64];
    snprintf(what, sizeof(what), "ring %d out", r);
    compare(what, rc->g_out[r], rc->out[r], rc->nout, rc->B, rc->T, rc->NH, rc->KV, HS);
    snprintf(what, sizeof(what), "ring %d lse", r);
    compare(what, rc->g_lse[r], rc->lse[r], rc->nlse, rc->B, rc->T, rc->NH, rc->KV, HS);
    for (size_t k = 0; k < rc->nout; k++) { rc->out[r][k] = (float)(floatX)rc->out[r][k]; }
    rc->x_out[r] = to_bf16(rc->out[r], rc->nout);
    for (int b = 0; b < rc->B; b++) {
        for (int h = 0; h < rc->NH; h++) {
            for (int q = 0; q < rc->T; q++) { flash_row_dot_body<HS>(rc->g_D[r], rc->x_dout[r], rc->x_out[r], b, h, q, rc->T, rc->NH); }
        }
    }
}

// every block backward, through the loops and the flash bodies (dK/dV a block per (key tile, kv head, batch), dQ per
// (query tile, query head, batch))
template <int HS>
static void ring_backward(RingCase *rc, unsigned char *smem) {
    int nt = ceil_div(rc->c, FA_TILE);
    ring_blocks(rc, [&](int i, int j, int q0, int k0, int causal) {
        attention_block_backward_cpu(rc->dqkv[i], rc->dkv[j], rc->dout[i], rc->qkv[i], rc->out[i], rc->lse[i], rc->kv[j],
                                     rc->B, rc->T, rc->NH, rc->KV, HS, q0, k0, rc->c, causal);
        FaArgs a = ring_backward_args(rc, i, j, q0, k0, causal);
        for (int b = 0; b < rc->B; b++) {
            for (int bx = 0; bx < nt; bx++) {
                for (int kh = 0; kh < rc->KV; kh++) { run_block([&](int tid) { flash_backward_dkdv_body<HS>(smem, bx, kh, b, tid, a); }); }
                for (int h = 0; h < rc->NH; h++) { run_block([&](int tid) { flash_backward_dq_body<HS>(smem, bx, h, b, nt, tid, a); }); }
            }
        }
    });
}

template <int HS>
static void run_ring_case(int B, int N, int c, int NH, int KV) {
    RingCase rc;
    ring_alloc(&rc, B, N, c, NH, KV, HS);
    unsigned char *smem = (unsigned char *)aligned_alloc(64, (fa_dq_smem<HS>() + 63) / 64 * 64);
    ring_forward<HS>(&rc, smem);
    for (int r = 0; r < N; r++) { ring_check_forward<HS>(&rc, r); }
    ring_backward<HS>(&rc, smem);
    for (int r = 0; r < N; r++) {
        char what[64];
        snprintf(what, sizeof(what), "ring %d dqkv", r);   // (the k, v parts stay 0 in both: they go to dkv)
        compare(what, rc.g_dqkv[r], rc.dqkv[r], rc.nqkv, B, rc.T, NH, KV, HS);
        snprintf(what, sizeof(what), "ring %d dkv", r);
        compare(what, rc.g_dkv[r], rc.dkv[r], rc.nkv, B, rc.T, NH, KV, HS);
    }
    ring_free(&rc);
    free(smem);
}

// --mutate-ldmatrix: an ldmatrix emulated with .trans inverted, --mutate-cp-wait: a cp.async wait that retires
// one group too few; each must fail the cases (the replay's own check): the first case alone, three tiles deep
// (enough for both: every case loads V transposed, and a third tile's copy is in flight at the second's wait)
int main(int argc, char **argv) {
    emu_ldmatrix_mutation = argc > 1 && !strcmp(argv[1], "--mutate-ldmatrix");
    emu_cp_mutation = argc > 1 && !strcmp(argv[1], "--mutate-cp-wait");
    fa_host_ops.cp_async = emu_cp_async;
    fa_host_ops.cp_commit = emu_cp_commit;
    fa_host_ops.cp_wait = emu_cp_wait;
    pthread_barrier_init(&emu_barrier, NULL, FA_THREADS);
    for (int w = 0; w < FA_WARPS; w++) { pthread_barrier_init(&emu_warp_barrier[w], NULL, 32); }
    fa_host_ops.mma = emu_mma;
    fa_host_ops.shfl_xor = emu_shfl_xor;
    fa_host_ops.sync = emu_sync;
    fa_host_ops.ldmatrix = emu_ldmatrix;
    run_case<64>(1, 130, 2, 2);    // hs 64: two full tiles and a partial one (the causal edge inside a tile, rows past T)
    if (emu_ldmatrix_mutation || emu_cp_mutation) { return fails == 0; }   // (a mutation: caught, or not)
    run_case<128>(2, 64, 1, 1);    // hs 128: one tile, two batch indices
    run_case<64>(1, 7, 1, 1);      // fewer tokens than one warp's rows
    run_case<64>(1, 192, 1, 1);    // three whole tiles: the tiles off the diagonal unmasked, none past T
    run_case<64>(1, 130, 4, 2);    // grouped-query: 2 query heads per kv head
    run_case<128>(1, 70, 3, 1);    // multi-query: 3 query heads, one kv head
    run_ring_case<64>(1, 2, 80, 2, 2);    // cp 2: chunks of 80 (a tile and a partial one), hs 64
    run_ring_case<128>(2, 3, 64, 1, 1);   // cp 3: chunks of one whole tile, hs 128, two sequences
    run_ring_case<64>(1, 2, 80, 4, 2);    // cp 2, grouped-query
    run_ring_case<64>(1, 2, 40, 2, 1);    // cp 2, multi-query, chunks shorter than a tile
    printf("%-4s flash replay: %ld asynchronous copies never waited for\n", emu_unwaited ? "FAIL" : "ok", (long)emu_unwaited);
    return fails != 0 || emu_unwaited != 0;
}
