// Gradients: every rank's owned, reduced gradient against the reference's, element by element (fp32) or by
// blocks (bf16: BF16_BLOCK_RTOL), and the bf16 gradient check against PyTorch's (--bf16-grads).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// The gradient's blocks (BF16_BLOCK_RTOL): tensor id's layer slices of nblk (rows, cols) blocks, numbered
// in file order. For the full reference: each block's tensor, layer slice (an expert tensor's: the MoE layer),
// place in its slice (qkv: q, k, v; an expert tensor's: the expert) and rms, and per element (full layout, as
// floats so that unit_copy_full can cut them) its block's number; dshare: the rms of the block's change when the
// attention backward's D carries one bf16 rounding of Y (gpt2_ref.py's dterm.bin), over the block's rms (0: none).
typedef struct { int nblocks; int *tensor, *layer, *piece; float *rms; float *number; double *dshare; } GradBlocks;
typedef struct { double err2, worst_elem; long n, bad_elems; } BlockError;   // over the elements a rank checks

static double rms_of(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) { s += (double)x[i] * x[i]; }
    return n ? sqrt(s / n) : 0;
}

static void grad_blocks_init(const ModelConfig *c, const float *ref_all, const float *dterm, GradBlocks *gb) {
    gb->nblocks = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        TensorSpec s = tensor_spec(c, id);
        gb->nblocks += (s.layers < 0 ? 1 : s.layers) * s.nblk;
    }
    gb->tensor = (int *)malloc_check(gb->nblocks * sizeof(int));
    gb->layer = (int *)malloc_check(gb->nblocks * sizeof(int));
    gb->piece = (int *)malloc_check(gb->nblocks * sizeof(int));
    gb->rms = (float *)malloc_check(gb->nblocks * sizeof(float));
    gb->dshare = (double *)calloc_check(gb->nblocks, sizeof(double));
    gb->number = (float *)malloc_check(num_parameters(c) * sizeof(float));
    size_t off = 0;
    int b = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        TensorSpec s = tensor_spec(c, id);
        size_t bs = s.rows * s.cols;
        for (int l = 0; l < (s.layers < 0 ? 1 : s.layers); l++, off += s.nblk * bs) {
            double layer_rms = rms_of(ref_all + off, s.nblk * bs);
            for (int k = 0; k < s.nblk; k++, b++) {
                double r = rms_of(ref_all + off + k * bs, bs);
                gb->tensor[b] = id;
                gb->layer[b] = l;
                gb->piece[b] = k;
                gb->rms[b] = (float)(r < ldexp(layer_rms, -16) ? layer_rms : r);   // an exact zero: the layer's
                if (dterm && gb->rms[b] > 0) { gb->dshare[b] = rms_of(dterm + off + k * bs, bs) / gb->rms[b]; }
                for (size_t i = 0; i < bs; i++) { gb->number[off + k * bs + i] = (float)b; }
            }
        }
    }
}

static void grad_blocks_free(GradBlocks *gb) {
    free(gb->tensor); free(gb->layer); free(gb->piece); free(gb->rms); free(gb->number); free(gb->dshare);
}

// (elem: the element bound's multiple of the block rms: 1, more with routing flips, see compare_grads)
static void block_error_add(BlockError *e, float g, float r, float rms, double elem) {
    double d = fabs((double)g - r);
    e->err2 += d * d;
    e->n++;
    if (!(d <= fabs(r) + elem * rms)) { e->bad_elems++; }
    double ratio = d != d ? INFINITY : d / (fabs(r) + rms);
    if (ratio > e->worst_elem) { e->worst_elem = ratio; }
}

// A block's error rms over its rms (the error of an exact-zero block against a zero rms: 0 or infinite).
static double block_ratio(const GradBlocks *gb, const BlockError *e, int b) {
    if (e[b].n == 0) { return 0; }
    return gb->rms[b] > 0 ? sqrt(e[b].err2 / e[b].n) / gb->rms[b] : (e[b].err2 > 0 ? INFINITY : 0);
}

// Per tensor: the blocks whose error rms exceeds rtol x their rms (block_rtol[b] where given: a MoE expert's
// whose tokens the routing changed, see compare_grads), and the elements over their bound. The worst block is
// named (layer slice, place: of an expert tensor, MoE layer and expert) by its error over its tolerance.
// Returns the number of tensors that fail; checks them when `report`.
static int block_errors_report(const ModelConfig *c, const GradBlocks *gb, const BlockError *e, double rtol,
                               const double *block_rtol, int report) {
    int failed = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        long blocks = 0, bad_blocks = 0, elems = 0, bad_elems = 0, routed = 0;
        double worst = 0, worst_elem = 0, worst_used = -1, worst_tol = rtol, routed_tol = 0;
        int worst_b = -1;
        for (int b = 0; b < gb->nblocks; b++) {
            if (gb->tensor[b] != id || e[b].n == 0) { continue; }
            double ratio = block_ratio(gb, e, b), tol = block_rtol ? block_rtol[b] : rtol;
            blocks++;
            bad_blocks += !(ratio <= tol);
            if (tol > 1.01 * rtol) { routed++; routed_tol = fmax(routed_tol, tol); }   // (the note: more than 1%)
            elems += e[b].n;
            bad_elems += e[b].bad_elems;
            double used = ratio != ratio ? INFINITY : ratio / tol;
            if (used > worst_used) { worst_used = used; worst = ratio; worst_tol = tol; worst_b = b; }
            if (!(e[b].worst_elem <= worst_elem)) { worst_elem = e[b].worst_elem; }
        }
        if (blocks == 0) { continue; }
        int ok = bad_blocks == 0 && bad_elems == 0;
        failed += !ok;
        if (report) {
            char routed_note[160] = "";
            if (routed) {
                snprintf(routed_note, sizeof(routed_note), " (%ld of them with more for the attention's D or the experts "
                         "whose tokens the routing changed: up to %.3f)", routed, routed_tol);
            }
            TensorSpec s = tensor_spec(c, id);
            check(ok, "grad %-8s: %ld blocks, %ld with an error rms > %.1e x the block's rms%s (worst %.4f of tolerance "
                  "%.3f: %s %d, %s %d of %d); %ld elements, %ld with |g-ref| > |ref| + block rms (worst %.3f of it)",
                  tensor_names[id], blocks, bad_blocks, rtol, routed_note, worst, worst_tol,
                  s.experts ? "MoE layer" : "layer", s.layers < 0 ? 0 : gb->layer[worst_b], s.experts ? "expert" : "block",
                  s.experts ? gb->piece[worst_b] / (s.nblk / c->num_experts) : gb->piece[worst_b],
                  s.experts ? c->num_experts : s.nblk, elems, bad_elems, worst_elem);
        }
    }
    return failed;
}

// Compares the owned, reduced gradient of every unit against the same range cut from the full
// reference gradients, per element: |g - ref| <= GRAD_ATOL + GRAD_RTOL |ref|, reported per tensor.
// bf16 builds: per block (BF16_BLOCK_RTOL). There a MoE token may route otherwise (its margin below
// ROUTE_MARGIN: compare_routing checks that no other does), which changes the gradients in two ways:
//  - the experts whose assignments differ (rd->moved: a token kept by one side only, or kept by both with another
//    gate). Expert e's block is a sum of one term per assignment it keeps, n_e = rd->kept of them in the
//    reference (terms of one scale: tokens of similar inputs and output gradients, gates in (0, 1]), so m_e
//    terms added, removed or re-weighted change it by ~sqrt(m_e / n_e) of its rms where the terms point every
//    way (more coherent terms give a larger block rms, so less). Such a block gets 2 sqrt(m_e / max(n_e, 1))
//    (twice: the moved tokens' terms may be larger than the block's typical one) on top of the allowance
//    below; experts holding a handful of tokens (capacity and routing at initialisation leave some with
//    1-3) then get O(1): routing within the margin gives them another sum. Its elements: the same factor.
//  - every block, through the flipped tokens' outputs (the rows after them, through causal attention) and
//    input gradients: F flips over the Lm R T (layer, token) pairs change a block by F's share of its terms,
//    a relative rms of ~sqrt(2 F / (Lm R T)) spread evenly; the block bound gets twice that on top, the
//    element bound the same factor.
// (Parameters after the AdamW steps are not compared element-wise: an element whose gradient is
// rounding noise, e.g. the key biases, whose exact gradient is 0, moves by +-lr whatever the noise;
// the step losses are the check of the optimizer.)
// Each block's tolerance (bf16): rtol; 2 sqrt(kY) dshare more for the D term (the attention backward takes D =
// rowsum(dY o Y) from the stored bf16 Y, as FlashAttention does, and dS = P (dP - D) cancels: a block's share of D's
// error is the reference's dshare per rounding of Y, measured on the reference's own activations; kY: the roundings Y
// took before D reads it, 1, or up to 2 cp/U with the ring's merges, each block's partial output stored bf16;
// twice: the rounding model's rms against one draw); and an expert's block whose tokens were routed otherwise (m of
// the reference's n kept assignments, test/routing.h) 2 sqrt(m / n) more.
static double *block_tolerances(const ModelConfig *c, const GradBlocks *gb, const RouteDiff *rd, double rtol,
                                double kY) {
    double *brtol = (double *)malloc_check(gb->nblocks * sizeof(double));
    for (int b = 0; b < gb->nblocks; b++) {
        brtol[b] = rtol + 2.0 * sqrt(kY) * gb->dshare[b];
        TensorSpec s = tensor_spec(c, gb->tensor[b]);
        if (rd && rd->moved && s.experts) {   // (Llama's efcw: 2 blocks an expert, gate and up)
            size_t q = (size_t)gb->layer[b] * rd->E + gb->piece[b] / (s.nblk / rd->E);
            int moved = rd->moved[q], kept = rd->kept[q] > 1 ? rd->kept[q] : 1;
            if (moved > 0) { brtol[b] += 2.0 * sqrt((double)moved / kept); }
        }
    }
    return brtol;
}

#ifndef BF16_GRADS
// the fp32 builds' element-wise verdict per tensor
static void report_elementwise_grads(const long *bad, const long *checked, const double *worst) {
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (checked[i] == 0) { continue; }
        check(bad[i] == 0, "grad %-8s: %ld owned elements, %ld outside |g-ref| <= %.0e + %.0e|ref| (worst excess %.3e)",
              tensor_names[i], checked[i], bad[i], GRAD_ATOL, GRAD_RTOL, worst[i]);
    }
}
#endif

// kY for block_tolerances: the times a row's attention output is rounded to bf16 before the backward reads D from it:
// once, or, merged block by block on the ring over cp/U positions (two chunks a rank), up to 2 cp/U times
static double y_roundings(const Model *m) {
    int cp = m->grid->cp, U = m->cpring.U;
    return cp > 1 && U < cp ? 2.0 * cp / U : 1.0;
}

// dterm: the reference's dterm.bin (NULL: none).
static void compare_grads(Model *m, float *ref_all, const float *dterm, const RouteDiff *rd) {
    const ModelConfig *c = &m->config;
    float *ref[NUM_TENSORS];
    split_tensors(c, ref_all, ref);
#ifndef BF16_GRADS
    (void)rd; (void)dterm;
    double worst[NUM_TENSORS] = {0};
    long bad[NUM_TENSORS] = {0}, checked[NUM_TENSORS] = {0};
#else
    GradBlocks gb;
    grad_blocks_init(c, ref_all, dterm, &gb);
    BlockError *berr = (BlockError *)calloc_check(gb.nblocks, sizeof(BlockError));
    double rtol = BF16_BLOCK_RTOL + 2.0 * sqrt(2.0 * rd->flipped_share);
    double *brtol = block_tolerances(c, &gb, rd, rtol, y_roundings(m));
    float *numbers[NUM_TENSORS];
    split_tensors(c, gb.number, numbers);
#endif
    for (int u = 0; u < m->nunits; u++) {
        const Unit *U = &m->units[u];
        float *ref_unit = (float *)malloc_check(U->size * sizeof(float));
        unit_copy_full(c, U, ref, ref_unit, m->grid->tp, m->grid->tp_rank, 1);
        float *mine = (float *)malloc_check(U->size * sizeof(float));
        size_t start, len;
        zero_get_owned_grads(&m->zero, u, mine, &start, &len);
#ifdef BF16_GRADS
        float *number_unit = (float *)malloc_check(U->size * sizeof(float));
        unit_copy_full(c, U, numbers, number_unit, m->grid->tp, m->grid->tp_rank, 1);
#endif
        for (int k = 0; k < U->ntensors; k++) {
            const UnitTensor *t = &U->t[k];
            size_t a = t->offset > start ? t->offset : start;
            size_t b = t->offset + t->size < start + len ? t->offset + t->size : start + len;
            for (size_t i = a; i < b; i++) {
                float g = mine[i - start], r = ref_unit[i];
#ifdef BF16_GRADS
                int nb = (int)number_unit[i];
                block_error_add(&berr[nb], g, r, gb.rms[nb], brtol[nb] / BF16_BLOCK_RTOL);
#else
                double err = fabs((double)g - r), lim = GRAD_ATOL + GRAD_RTOL * fabs(r);
                if (!(err <= lim)) { bad[t->id]++; }
                if (err - lim > worst[t->id] || err != err) { worst[t->id] = err != err ? INFINITY : err - lim; }
                checked[t->id]++;
#endif
            }
        }
        free(ref_unit);
        free(mine);
#ifdef BF16_GRADS
        free(number_unit);
#endif
    }
#ifdef BF16_GRADS
    block_errors_report(c, &gb, berr, rtol, brtol, 1);
    free(berr);
    free(brtol);
    grad_blocks_free(&gb);
#else
    report_elementwise_grads(bad, checked, worst);
#endif
}

// --check-tolerance [--bf16-grads FILE]: the bf16 gradient tolerances (BF16_BLOCK_RTOL) applied to the full
// reference gradients, in any build. They pass the reference rounded to bf16 and a bf16 step emulated in
// PyTorch (FILE, from dev/reference/bf16_grads.py); they fail it with the q and k rows of qkvw zeroed (an
// attention backward that loses dq and dk: the per-element 1e-2 + 5e-2|ref| they replace passed that) in
// exactly those blocks, and with the whole qkv gradient zero.
static BlockError *block_errors(const GradBlocks *gb, const float *g, const float *ref, size_t n, const double *brtol) {
    BlockError *e = (BlockError *)calloc_check(gb->nblocks, sizeof(BlockError));
    for (size_t i = 0; i < n; i++) {
        int b = (int)gb->number[i];
        block_error_add(&e[b], g[i], ref[i], gb->rms[b], brtol ? brtol[b] / BF16_BLOCK_RTOL : 1.0);
    }
    return e;
}

static long old_tolerance_misses(const float *g, const float *ref, size_t n) {   // 1e-2 + 5e-2|ref|
    long bad = 0;
    for (size_t i = 0; i < n; i++) { bad += !(fabs((double)g[i] - ref[i]) <= 1e-2 + 5e-2 * fabs(ref[i])); }
    return bad;
}

static void check_zeroed_qkv(const ModelConfig *c, const GradBlocks *gb, const double *brtol, const float *ref, float *g,
                             int rows_zeroed) {
    size_t P = num_parameters(c), C = c->channels;
    float *t[NUM_TENSORS];
    memcpy(g, ref, P * sizeof(float));
    split_tensors(c, g, t);
    for (int l = 0; l < c->num_layers; l++) { memset(t[T_QKVW] + l * 3 * C * C, 0, rows_zeroed * C * C * sizeof(float)); }
    const float *ref_qkv = ref + (t[T_QKVW] - g);
    BlockError *e = block_errors(gb, g, ref, P, brtol);
    int flagged_zeroed = 0, flagged_other = 0, qkv_blocks = 0;
    for (int b = 0; b < gb->nblocks; b++) {
        int zeroed = gb->tensor[b] == T_QKVW && qkv_blocks++ % 3 < rows_zeroed;
        int flagged = !(block_ratio(gb, e, b) <= brtol[b]);
        if (zeroed) { flagged_zeroed += flagged; } else { flagged_other += flagged; }
    }
    check(flagged_zeroed == rows_zeroed * c->num_layers && flagged_other == 0,
          "bf16 tolerances, qkvw's first %d C rows zeroed in each layer: %d of the %d blocks zeroed fail, %d others "
          "(the per-element 1e-2 + 5e-2|ref| flags %ld of %zu elements)",
          rows_zeroed, flagged_zeroed, rows_zeroed * c->num_layers, flagged_other,
          old_tolerance_misses(t[T_QKVW], ref_qkv, tensor_full_size(c, T_QKVW)), tensor_full_size(c, T_QKVW));
    free(e);
}

static void check_tolerance(const ModelConfig *c, const float *ref, const float *dterm, const char *emulated_path) {
    size_t P = num_parameters(c);
    GradBlocks gb;
    grad_blocks_init(c, ref, dterm, &gb);
    double *brtol = block_tolerances(c, &gb, NULL, BF16_BLOCK_RTOL, 1.0);   // (one device, no cp: Y rounded once)
    float *g = (float *)malloc_check(P * sizeof(float));
    for (size_t i = 0; i < P; i++) { g[i] = bf16_to_float(float_to_bf16(ref[i])); }
    BlockError *e = block_errors(&gb, g, ref, P, NULL);
    check(block_errors_report(c, &gb, e, BF16_BLOCK_RTOL, NULL, 0) == 0, "bf16 tolerances: the reference gradients rounded to bf16 pass (%d blocks)",
          gb.nblocks);
    free(e);
    if (emulated_path) {
        FILE *f = fopen_check(emulated_path, "rb");
        if (fread(g, sizeof(float), P, f) != P || fgetc(f) != EOF) {
            fail_all(my_rank, "--bf16-grads %s: expected %zu fp32 gradients (dev/reference/bf16_grads.py)", emulated_path, P);
        }
        fclose(f);
        if (my_rank == 0) { printf("bf16 tolerances on a bf16 step emulated in PyTorch (%s):\n", emulated_path); }
        e = block_errors(&gb, g, ref, P, brtol);
        block_errors_report(c, &gb, e, BF16_BLOCK_RTOL, brtol, 1);
        free(e);
    }
    check_zeroed_qkv(c, &gb, brtol, ref, g, 2);   // q and k: a lost dq, dk
    check_zeroed_qkv(c, &gb, brtol, ref, g, 3);   // the whole qkv gradient
    free(brtol);
    free(g);
    grad_blocks_free(&gb);
}
