// Attention: the CPU build's attention through BLAS (attention.h's panels, context_parallel.h's ring blocks)
// against the plain loops, GQA against its definition, at derived tolerances (--check-attention).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// ----------------------------------------------------------------------------
// --check-attention: the CPU build's attention through BLAS (attention.h's panels, context_parallel.h's
// ring blocks) against the plain loops, their specification, where the model references do not reach:
// T = 1, T not a multiple of a tile, several key tiles, diagonal tiles cut anywhere (tiny tiles), head
// sizes 16, 32, 48 and 64, a single (batch, head) (with 2+ threads: the backward's all-threads-per-sgemm path),
// the ring's blocks at chunk offsets, causal and not, merged into an earlier block's result; grouped-query
// attention (KV = 1 and 2 kv heads for 4 query heads), and the plain loops with KV < NH against their
// definition (the KV = NH loops on the kv heads repeated).
// The tolerance per element is derived, no constant fitted to a run: both compute the same sums in other
// orders and blockings, the softmax against another running max. u = 2^-24; any order of summing n
// products is off by at most g(n) = n u times the sum of their absolute values (any BLAS kernel, threads).
//  - a score s = scale q.k is off by ds <= g(hs) scale sum|q k| + 2u |s|; E = the max of ds over a row
//  - out = sum_j p_j v_j / l, p_j = exp(s_j - m): each term relatively off by R = 2E (s_j's and the max's
//    errors) + (3n + 24) u (the sums l and out, the exps, the division) + (2n + 4) u smax + 4u |lse|
//    (the exps' arguments, up to n rescalings by exp(m_old - m_new)), on sum_j p_j |v_j| + w1 |y1| (a ring
//    block merges into an earlier result y1 of weight w1 = exp(lse1 - lse));  lse: 2E + (n + 8 + 4|lse|) u
//  - backward (the same out and lse in both): p relatively off by ep = ds + 2u (|s| + |lse|) + 4u, dp = dy.v
//    and D = dy.y by g(hs) sum|dy v|, g(hs) sum|dy y|, so ds = p (dp - D) scale by
//    Eds = |ds| (ep + 3u) + p scale g(hs) (sum|dy v| + sum|dy y|); then dq_i by sum_j Eds |k_j| +
//    g(n+1) (sum_j |ds k_j| + |dq_i before|) (a ring block adds to what is there), dk, dv likewise with
//    g(G n + 1): with grouped-query attention a kv head's dk, dv sum the terms of its G query heads.
// Each computation is within that (first-order) bound of the exact value: the two within twice of it.
static const double ATT_U = 1.0 / 16777216.0;

// scale x.y over n in double, and the same over |terms| into *abs
static double att_dot(const float *x, const float *y, int n, double scale, double *abs) {
    double s = 0.0, a = 0.0;
    for (int c = 0; c < n; c++) { s += (double)x[c] * y[c]; a += fabs((double)x[c] * y[c]); }
    *abs = a * scale;
    return s * scale;
}

// Forward tolerances of one head's n query rows (row i sees keys j <= i + diag; inputs a) into to (rows at
// ldo) and tl, from the plain loops' lse and the earlier result they merged into (y1 at ldo, lse1; NULL: none)
static void att_tol_forward(float *to, float *tl, int ldo, AttHead a, const float *lse, const float *y1,
                            const float *lse1, int n, int diag) {
    double u = ATT_U, sa;
    for (int i = 0; i < n; i++) {
        const float *q = a.q + (size_t)i * a.ldq;
        int nv = att_visible(i, diag, n);
        double E = 0.0, smax = 0.0, L = lse[i], w1 = lse1 ? exp((double)lse1[i] - L) : 0.0;
        for (int j = 0; j < nv; j++) {
            double s = att_dot(q, a.k + (size_t)j * a.ldkv, a.hs, a.scale, &sa);
            E = fmax(E, a.hs * u * sa + 2 * u * fabs(s));
            smax = fmax(smax, fabs(s));
        }
        double R = 2 * E + (3.0 * nv + 24 + (2.0 * nv + 4) * smax + 4 * fabs(L)) * u;
        for (int c = 0; c < a.hs; c++) { to[(size_t)i * ldo + c] = y1 ? (float)(2 * R * w1 * fabs(y1[(size_t)i * ldo + c])) : 0.0f; }
        for (int j = 0; j < nv; j++) {
            double p = exp(att_dot(q, a.k + (size_t)j * a.ldkv, a.hs, a.scale, &sa) - L);
            for (int c = 0; c < a.hs; c++) { to[(size_t)i * ldo + c] += (float)(2 * R * p * fabs(a.v[(size_t)j * a.ldkv + c])); }
        }
        tl[i] = (float)(2 * (2 * E + (nv + 8 + 4 * fabs(L)) * u));
    }
}

// Backward tolerances of the same rows into t (dq, dk, dv at t's lds; zeros on entry: a kv head's add up over
// the calls of its G query heads), from the plain loops' out (rows at ldy) and lse; g0: the gradients added to
// (dq NULL: zeros; dk, dv NULL: zeros, or counted by another query head's call)
static void att_tol_backward(AttGrad t, AttHead a, const float *y, int ldy, const float *lse, AttGrad g0, int n,
                             int diag, int G) {
    double u = ATT_U, ghs = a.hs * u, gn = (n + 1) * u, gkv = ((double)G * n + 1) * u, sa, dpa, Da;
    for (int i = 0; i < n; i++) {
        const float *q = a.q + (size_t)i * a.ldq, *dy = a.dout + (size_t)i * a.ldo;
        double L = lse[i], D = att_dot(dy, y + (size_t)i * ldy, a.hs, 1.0, &Da);
        for (int j = 0; j < att_visible(i, diag, n); j++) {
            const float *k = a.k + (size_t)j * a.ldkv, *v = a.v + (size_t)j * a.ldkv;
            double s = att_dot(q, k, a.hs, a.scale, &sa), dp = att_dot(dy, v, a.hs, 1.0, &dpa);
            double p = exp(s - L), ds = p * (dp - D) * a.scale, ep = ghs * sa + 2 * u * (fabs(s) + fabs(L)) + 4 * u;
            double Eds = fabs(ds) * (ep + 3 * u) + p * a.scale * ghs * (dpa + Da);
            for (int c = 0; c < a.hs; c++) {
                t.dq[(size_t)i * t.lddq + c] += (float)(2 * (Eds * fabs(k[c]) + gn * fabs(ds * k[c])));
                t.dk[(size_t)j * t.lddkv + c] += (float)(2 * (Eds * fabs(q[c]) + gkv * fabs(ds * q[c])));
                t.dv[(size_t)j * t.lddkv + c] += (float)(2 * p * (ep + gkv) * fabs(dy[c]));
            }
        }
    }
    for (int r = 0; r < n; r++) {   // what was there before
        for (int c = 0; c < a.hs && g0.dq; c++) {
            t.dq[(size_t)r * t.lddq + c] += (float)(2 * gn * fabs(g0.dq[(size_t)r * g0.lddq + c]));
        }
        for (int c = 0; c < a.hs && g0.dk; c++) {
            t.dk[(size_t)r * t.lddkv + c] += (float)(2 * gkv * fabs(g0.dk[(size_t)r * g0.lddkv + c]));
            t.dv[(size_t)r * t.lddkv + c] += (float)(2 * gkv * fabs(g0.dv[(size_t)r * g0.lddkv + c]));
        }
    }
}

// 1 if |got - want| <= tol for each of n elements; the worst |got - want| / tol and largest |got - want|
// into *worst, *diff
static int att_within(const float *got, const float *want, const float *tol, size_t n, double *worst, double *diff) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] == want[i] ? 0.0 : fabs((double)got[i] - want[i]);   // (-inf = -inf: a row no block reached)
        ok &= d <= tol[i];   // (false for NaN)
        if (d > *diff) { *diff = d; }
        if (d > 0 && d / tol[i] > *worst) { *worst = d / tol[i]; }
    }
    return ok;
}

static float *att_random(size_t n, Rng *r, float std) {
    float *x = (float *)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = rng_normal(r, 0.0f, std); }
    return x;
}

// One-device attention, B T, NH query heads sharing KV kv heads of size hs, tiles qt x kt: attention_forward_blas /
// attention_backward_blas against attention_forward_cpu / attention_backward_cpu (both backwards from the plain
// forward's out and lse)
static void check_attention_case(Rng *rng, int B, int T, int NH, int KV, int hs, int qt, int kt) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV;
    size_t n3 = (size_t)B * T * W, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *y = (float *)calloc_check(2 * (ny + nl + n3), sizeof(float)), *lse = y + ny, *d = lse + nl;  // the loops'
    float *y2 = d + n3, *lse2 = y2 + ny, *d2 = lse2 + nl;                                             // BLAS's
    float *tol = (float *)calloc_check(ny + nl + n3, sizeof(float)), *tl = tol + ny, *td = tl + nl;
    att_panel_rows = qt; att_key_tile = kt;
    attention_forward_cpu(y, lse, qkv, B, T, NH, KV, hs);
    attention_forward_blas(y2, lse2, qkv, B, T, NH, KV, hs);
    attention_backward_cpu(d, dout, qkv, y, lse, B, T, NH, KV, hs);
    attention_backward_blas(d2, dout, qkv, y, lse, B, T, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = (size_t)b * T * W + h * hs, rk = (size_t)b * T * W + (NH + h / G) * hs;   // q; its kv head's k
            size_t r1 = (size_t)b * T * C + h * hs, rl = ((size_t)b * NH + h) * T;
            AttHead a = {qkv + r3, qkv + rk, qkv + rk + KV * hs, dout + r1, W, W, C, hs, 1.0f / sqrtf((float)hs)};
            att_tol_forward(tol + r1, tl + rl, C, a, lse + rl, NULL, NULL, T, 0);
            AttGrad t = {td + r3, td + rk, td + rk + KV * hs, W, W}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, T, 0, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int ok = att_within(y2, y, tol, ny, &worst, &diff) & att_within(lse2, lse, tl, nl, &worst, &diff)
             & att_within(d2, d, td, n3, &worst, &diff);
    check(ok, "attention through BLAS = the loops: B %d T %d NH %d KV %d hs %d, tiles %d x %d: out, lse, dqkv within "
          "the derived bounds (worst %.3f of a bound; largest difference %.1e)", B, T, NH, KV, hs, qt, kt, worst, diff);
    free(qkv); free(dout); free(y); free(tol);
}

// kv (B, T, 2 KV hs): the k and v parts of qkv (B, T, (NH + 2KV) hs)
static float *att_kv_of(const float *qkv, size_t rows, int NH, int KV, int hs) {
    size_t W = (size_t)(NH + 2 * KV) * hs, W2 = (size_t)2 * KV * hs;
    float *kv = (float *)malloc_check(rows * W2 * sizeof(float));
    for (size_t r = 0; r < rows; r++) { memcpy(kv + r * W2, qkv + r * W + (size_t)NH * hs, W2 * sizeof(float)); }
    return kv;
}

// One ring block (context_parallel.h), local T = 2c: query chunk qa's rows over key chunk kb's keys, causal
// when qa == kb. The forward merges into what an earlier block (key chunk 1 - kb, by the loops) left; the
// backward adds to random dq, dk, dv, with the out and lse of the plain causal attention over the T rows.
static void check_attention_block_case(Rng *rng, int B, int c, int NH, int KV, int hs, int qa, int kb, int qt, int kt) {
    int T = 2 * c, W = (NH + 2 * KV) * hs, W2 = 2 * KV * hs, C = NH * hs, G = NH / KV;
    int causal = qa == kb, q0 = qa * c, k0 = kb * c;
    size_t n3 = (size_t)B * T * W, n2 = (size_t)B * T * W2, ny = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *d0 = att_random(n3 + n2, rng, 1.0f), *dkv0 = d0 + n3;   // the gradients added to
    float *kv = att_kv_of(qkv, (size_t)B * T, NH, KV, hs);
    // before (y1, lse1); the loops' (y, lse, d, dkv); BLAS's (y2, lse2, d2, dkv2)
    float *y1 = (float *)malloc_check((3 * (ny + nl) + 2 * (n3 + n2)) * sizeof(float)), *lse1 = y1 + ny;
    float *y = lse1 + nl, *lse = y + ny, *y2 = lse + nl, *lse2 = y2 + ny;
    float *d = lse2 + nl, *dkv = d + n3, *d2 = dkv + n2, *dkv2 = d2 + n3;
    float *tol = (float *)calloc_check(ny + nl + n3 + n2, sizeof(float)), *tl = tol + ny, *td = tl + nl, *tkv = td + n3;
    att_panel_rows = qt; att_key_tile = kt;
    for (size_t i = 0; i < ny + nl; i++) { y1[i] = i < ny ? 0.0f : -INFINITY; }   // no block yet: out 0, lse -inf
    attention_block_forward_cpu(y1, lse1, qkv, kv, B, T, NH, KV, hs, q0, (1 - kb) * c, c, 0);
    memcpy(y, y1, (ny + nl) * sizeof(float)); memcpy(y2, y1, (ny + nl) * sizeof(float));   // y, lse follow
    attention_block_forward_cpu(y, lse, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_forward_blas(y2, lse2, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, scale};
            att_tol_forward(tol + r1, tl + rl, C, a, lse + rl, y1 + r1, lse1 + rl, c, causal ? 0 : c);
        }
    }
    attention_forward_cpu(y1, lse1, qkv, B, T, NH, KV, hs);   // the backward's out and lse
    memcpy(d, d0, (n3 + n2) * sizeof(float)); memcpy(d2, d0, (n3 + n2) * sizeof(float));    // d, dkv follow
    attention_block_backward_cpu(d, dkv, dout, qkv, y1, lse1, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_backward_blas(d2, dkv2, dout, qkv, y1, lse1, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, scale};
            AttGrad t = {td + r3, tkv + r2, tkv + r2 + KV * hs, W, W2};
            float *dk0 = h % G ? NULL : dkv0 + r2;   // (a kv head's earlier dk, dv: counted with its first query head)
            AttGrad g0 = {d0 + r3, dk0, dk0 ? dk0 + KV * hs : NULL, W, W2};
            att_tol_backward(t, a, y1 + r1, C, lse1 + rl, g0, c, causal ? 0 : c, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int ok = att_within(y2, y, tol, ny, &worst, &diff) & att_within(lse2, lse, tl, nl, &worst, &diff)
             & att_within(d2, d, td, n3, &worst, &diff) & att_within(dkv2, dkv, tkv, n2, &worst, &diff);
    check(ok, "ring block through BLAS = the loops: B %d c %d NH %d KV %d hs %d, query chunk %d x key chunk %d (%s), "
          "tiles %d x %d: out, lse, dq, dk, dv within the derived bounds (worst %.3f of a bound; largest difference "
          "%.1e)", B, c, NH, KV, hs, qa, kb, causal ? "causal" : "full", qt, kt, worst, diff);
    free(qkv); free(dout); free(d0); free(kv); free(y1); free(tol);
}

// Rows [x (P floats) | k heads (KV hs) | v heads (KV hs)] -> rows [x | NH k heads | NH v heads], head h a copy of kv
// head h / G: grouped-query attention's operands as multi-head attention's (new, rows * (P + 2 NH hs) floats)
static float *att_repeat_kv(const float *in, size_t rows, int P, int NH, int KV, int hs) {
    size_t Win = P + (size_t)2 * KV * hs, Wout = P + (size_t)2 * NH * hs;
    float *out = (float *)malloc_check(rows * Wout * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        memcpy(out + r * Wout, in + r * Win, P * sizeof(float));
        for (int part = 0; part < 2; part++) {   // k, then v
            for (int h = 0; h < NH; h++) {
                memcpy(out + r * Wout + P + (size_t)(part * NH + h) * hs,
                       in + r * Win + P + (size_t)(part * KV + h / (NH / KV)) * hs, hs * sizeof(float));
            }
        }
    }
    return out;
}

// ... and back, for their gradients: kv head kh's dk, dv the sums of its G copies', in order
static void att_sum_kv(float *out, const float *in, size_t rows, int P, int NH, int KV, int hs) {
    size_t Win = P + (size_t)2 * NH * hs, Wout = P + (size_t)2 * KV * hs;
    int G = NH / KV;
    for (size_t r = 0; r < rows; r++) {
        memcpy(out + r * Wout, in + r * Win, P * sizeof(float));
        for (int part = 0; part < 2; part++) {
            for (int c = 0; c < KV * hs; c++) {   // kv head c / hs, its dimension c % hs
                float sum = 0.0f;
                for (int g = 0; g < G; g++) { sum += in[r * Win + P + (size_t)part * NH * hs + (c / hs * G + g) * hs + c % hs]; }
                out[r * Wout + P + (size_t)part * KV * hs + c] = sum;
            }
        }
    }
}

// 1 if the first n floats of each of `rows` rows of a and b (ld apart) are the same bits
static int att_same_rows(const float *a, const float *b, size_t rows, size_t ld, size_t n) {
    int same = 1;
    for (size_t r = 0; r < rows; r++) { same &= !memcmp(a + r * ld, b + r * ld, n * sizeof(float)); }
    return same;
}

// Grouped-query attention is its definition: the plain loops with KV kv heads = the loops with KV = NH on the kv
// heads repeated G times. out, lse and dq exactly (the same sums in the same order); dk and dv = the sums of the G
// copies' within the derived bounds (the same G T terms, summed in another order).
static void check_gqa_definition(Rng *rng, int B, int T, int NH, int KV, int hs) {
    int W = (NH + 2 * KV) * hs, C = NH * hs, G = NH / KV;
    size_t rows = (size_t)B * T, n3 = rows * W, ny = rows * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f);
    float *rep = att_repeat_kv(qkv, rows, C, NH, KV, hs);
    float *y = (float *)calloc_check(2 * (ny + nl) + 3 * n3 + 3 * ny, sizeof(float)), *lse = y + ny;
    float *y1 = lse + nl, *lse1 = y1 + ny, *d = lse1 + nl, *dsum = d + n3, *td = dsum + n3, *d1 = td + n3;
    attention_forward_cpu(y, lse, qkv, B, T, NH, KV, hs);
    attention_forward_cpu(y1, lse1, rep, B, T, NH, NH, hs);
    attention_backward_cpu(d, dout, qkv, y, lse, B, T, NH, KV, hs);
    attention_backward_cpu(d1, dout, rep, y, lse, B, T, NH, NH, hs);
    att_sum_kv(dsum, d1, rows, C, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = (size_t)b * T * W + h * hs, rk = (size_t)b * T * W + (NH + h / G) * hs;
            size_t r1 = (size_t)b * T * C + h * hs, rl = ((size_t)b * NH + h) * T;
            AttHead a = {qkv + r3, qkv + rk, qkv + rk + KV * hs, dout + r1, W, W, C, hs, 1.0f / sqrtf((float)hs)};
            AttGrad t = {td + r3, td + rk, td + rk + KV * hs, W, W}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, T, 0, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int exact = !memcmp(y, y1, ny * sizeof(float)) && !memcmp(lse, lse1, nl * sizeof(float))
                && att_same_rows(d, dsum, rows, W, C);
    int ok = att_within(d, dsum, td, n3, &worst, &diff);
    check(exact && ok, "grouped-query attention = its definition (the loops on the kv heads repeated %d times): B %d "
          "T %d NH %d KV %d hs %d: out, lse, dq the same bits (%s), dk, dv within the derived bounds (worst %.3f of a "
          "bound; largest difference %.1e)", G, B, T, NH, KV, hs, exact ? "yes" : "no", worst, diff);
    free(qkv); free(dout); free(rep); free(y);
}

// ... and the ring's blocks' loops (query chunk qa over key chunk kb of T = 2c rows, from no earlier block; the
// backward from their out and lse, into zeros): out, lse, dq exactly, dk, dv within the derived bounds
static void check_gqa_block_definition(Rng *rng, int B, int c, int NH, int KV, int hs, int qa, int kb) {
    int T = 2 * c, W = (NH + 2 * KV) * hs, W2 = 2 * KV * hs, C = NH * hs, G = NH / KV;
    int causal = qa == kb, q0 = qa * c, k0 = kb * c;
    size_t rows = (size_t)B * T, n3 = rows * W, n2 = rows * W2, ny = rows * C, nl = (size_t)B * NH * T;
    float *qkv = att_random(n3, rng, 1.5f), *dout = att_random(ny, rng, 1.0f), *kv = att_kv_of(qkv, rows, NH, KV, hs);
    float *rep = att_repeat_kv(qkv, rows, C, NH, KV, hs), *kvrep = att_repeat_kv(kv, rows, 0, NH, KV, hs);
    // GQA's and the definition's (1): out, lse; dqkv (dsum: the copies' summed back); dkv; the tolerances
    float *y = (float *)calloc_check(2 * (ny + nl), sizeof(float)), *lse = y + ny, *y1 = lse + nl, *lse1 = y1 + ny;
    float *d = (float *)calloc_check(3 * n3 + 3 * ny, sizeof(float)), *dsum = d + n3, *td = dsum + n3, *d1 = td + n3;
    float *dkv = (float *)calloc_check(3 * n2 + 2 * ny, sizeof(float)), *dksum = dkv + n2, *tkv = dksum + n2;
    float *dkv1 = tkv + n2;
    for (size_t i = 0; i < ny + nl; i++) { y[i] = y1[i] = i < ny ? 0.0f : -INFINITY; }   // no block yet
    attention_block_forward_cpu(y, lse, qkv, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_forward_cpu(y1, lse1, rep, kvrep, B, T, NH, NH, hs, q0, k0, c, causal);
    attention_block_backward_cpu(d, dkv, dout, qkv, y, lse, kv, B, T, NH, KV, hs, q0, k0, c, causal);
    attention_block_backward_cpu(d1, dkv1, dout, rep, y, lse, kvrep, B, T, NH, NH, hs, q0, k0, c, causal);
    att_sum_kv(dsum, d1, rows, C, NH, KV, hs);     // (the k, v parts: zeros in both)
    att_sum_kv(dksum, dkv1, rows, 0, NH, KV, hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t r3 = ((size_t)b * T + q0) * W + h * hs, r2 = ((size_t)b * T + k0) * W2 + (h / G) * hs;
            size_t r1 = ((size_t)b * T + q0) * C + h * hs, rl = ((size_t)b * NH + h) * T + q0;
            AttHead a = {qkv + r3, kv + r2, kv + r2 + KV * hs, dout + r1, W, W2, C, hs, 1.0f / sqrtf((float)hs)};
            AttGrad t = {td + r3, tkv + r2, tkv + r2 + KV * hs, W, W2}, none = {NULL, NULL, NULL, 0, 0};
            att_tol_backward(t, a, y + r1, C, lse + rl, none, c, causal ? 0 : c, G);
        }
    }
    double worst = 0.0, diff = 0.0;
    int exact = !memcmp(y, y1, ny * sizeof(float)) && !memcmp(lse, lse1, nl * sizeof(float))
                && !memcmp(d, dsum, n3 * sizeof(float));
    int ok = att_within(dkv, dksum, tkv, n2, &worst, &diff);
    check(exact && ok, "ring block = its definition (the loops on the kv heads repeated %d times): B %d c %d NH %d KV "
          "%d hs %d, query chunk %d x key chunk %d (%s): out, lse, dq the same bits (%s), dk, dv within the derived "
          "bounds (worst %.3f of a bound; largest difference %.1e)", G, B, c, NH, KV, hs, qa, kb,
          causal ? "causal" : "full", exact ? "yes" : "no", worst, diff);
    free(qkv); free(dout); free(kv); free(rep); free(kvrep); free(y); free(d); free(dkv);
}


static void check_attention(void) {
    Rng rng;
    rng_init(&rng, 24);
    int tiles[3][2] = {{att_panel_rows, att_key_tile}, {16, 8}, {5, 7}};   // the default, then small and ragged
    for (int k = 0; k < 3; k++) {
        int qt = tiles[k][0], kt = tiles[k][1];
        check_attention_case(&rng, 1, 1, 2, 2, 32, qt, kt);      // T = 1
        check_attention_case(&rng, 2, 37, 2, 2, 48, qt, kt);     // head size 48, T not a multiple of a tile
        check_attention_case(&rng, 1, 70, 1, 1, 64, qt, kt);     // one (batch, head), head size 64
        check_attention_case(&rng, 1, 300, 4, 4, 32, qt, kt);    // head size 32, more than one key tile at the default
        check_attention_case(&rng, 2, 37, 4, 2, 16, qt, kt);     // grouped-query: 2 query heads per kv head
        check_attention_case(&rng, 1, 70, 4, 1, 16, qt, kt);     // multi-query: one kv head
        for (int qa = 0; qa < 2; qa++) {
            for (int kb = 0; kb < 2; kb++) {
                check_attention_block_case(&rng, 2, 19, 2, 2, 48, qa, kb, qt, kt);   // chunks of 19, head size 48
                check_attention_block_case(&rng, 2, 19, 4, 2, 16, qa, kb, qt, kt);   // grouped-query
            }
        }
        check_attention_block_case(&rng, 1, 1, 2, 2, 32, 1, 1, qt, kt);   // chunks of one token (cp 8 at T 16)
        check_attention_block_case(&rng, 1, 23, 4, 1, 16, 1, 0, qt, kt);  // multi-query
    }
    att_panel_rows = tiles[0][0]; att_key_tile = tiles[0][1];
    int kvs[3] = {1, 2, 4};   // for 4 query heads: multi-query, 2 per kv head, multi-head
    for (int i = 0; i < 3; i++) {
        check_gqa_definition(&rng, 2, 37, 4, kvs[i], 16);
        check_gqa_block_definition(&rng, 2, 19, 4, kvs[i], 16, 1, 0);   // a full block
        check_gqa_block_definition(&rng, 2, 19, 4, kvs[i], 16, 1, 1);   // a causal one
    }
}
