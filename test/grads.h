// Gradients: every rank's owned, reduced gradient against the reference's, element by element (fp32) or by
// blocks (bf16: BF16_BLOCK_RTOL), and the bf16 gradient check against PyTorch's (--bf16-grads).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// The gradient's blocks (BF16_BLOCK_RTOL): tensor id's layer slices of nblk (rows, cols) blocks, numbered
// in file order. For the full reference: each block's tensor and rms, and per element (full layout, as
// floats so that unit_copy_full can cut them) its block's number.
typedef struct { int nblocks; int *tensor; float *rms; float *number; } GradBlocks;
typedef struct { double err2, worst_elem; long n, bad_elems; } BlockError;   // over the elements a rank checks

static double rms_of(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) { s += (double)x[i] * x[i]; }
    return n ? sqrt(s / n) : 0;
}

static void grad_blocks_init(const ModelConfig *c, const float *ref_all, GradBlocks *gb) {
    gb->nblocks = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        TensorSpec s = tensor_spec(c, id);
        gb->nblocks += (s.layers < 0 ? 1 : s.layers) * s.nblk;
    }
    gb->tensor = (int *)malloc_check(gb->nblocks * sizeof(int));
    gb->rms = (float *)malloc_check(gb->nblocks * sizeof(float));
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
                gb->rms[b] = (float)(r < ldexp(layer_rms, -16) ? layer_rms : r);   // an exact zero: the layer's
                for (size_t i = 0; i < bs; i++) { gb->number[off + k * bs + i] = (float)b; }
            }
        }
    }
}

static void grad_blocks_free(GradBlocks *gb) { free(gb->tensor); free(gb->rms); free(gb->number); }

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

// Per tensor: the blocks whose error rms exceeds BF16_BLOCK_RTOL x their rms, and the elements over their
// bound. Returns the number of tensors that fail; checks them when `report`.
static int block_errors_report(const GradBlocks *gb, const BlockError *e, double rtol, int report) {
    int failed = 0;
    for (int id = 0; id < NUM_TENSORS; id++) {
        long blocks = 0, bad_blocks = 0, elems = 0, bad_elems = 0;
        double worst = 0, worst_elem = 0;
        for (int b = 0; b < gb->nblocks; b++) {
            if (gb->tensor[b] != id || e[b].n == 0) { continue; }
            double ratio = block_ratio(gb, e, b);
            blocks++;
            bad_blocks += !(ratio <= rtol);
            elems += e[b].n;
            bad_elems += e[b].bad_elems;
            if (!(ratio <= worst)) { worst = ratio; }
            if (!(e[b].worst_elem <= worst_elem)) { worst_elem = e[b].worst_elem; }
        }
        if (blocks == 0) { continue; }
        int ok = bad_blocks == 0 && bad_elems == 0;
        failed += !ok;
        if (report) {
            check(ok, "grad %-8s: %ld blocks, %ld with an error rms > %.1e x the block's rms (worst %.4f); %ld elements, %ld "
                  "with |g-ref| > |ref| + block rms (worst %.3f of it)",
                  tensor_names[id], blocks, bad_blocks, rtol, worst, elems, bad_elems, worst_elem);
        }
    }
    return failed;
}

// Compares the owned, reduced gradient of every unit against the same range cut from the full
// reference gradients, per element: |g - ref| <= GRAD_ATOL + GRAD_RTOL |ref|, reported per tensor.
// bf16 builds: per block (BF16_BLOCK_RTOL). There a MoE token may route otherwise (its margin below
// ROUTE_MARGIN): F such tokens over the Lm R T (layer, token) pairs change an expert's gradient by F's
// share of its ~k R T / E tokens' terms and every block upstream by less: a relative rms of ~sqrt(2 F /
// (Lm R T)) spread evenly; the block bound gets twice that on top, the element bound the same factor.
// (Parameters after the AdamW steps are not compared element-wise: an element whose gradient is
// rounding noise, e.g. the key biases, whose exact gradient is 0, moves by +-lr whatever the noise;
// the step losses are the check of the optimizer.)
static void compare_grads(Model *m, float *ref_all, double flipped_share) {
    const ModelConfig *c = &m->config;
    float *ref[NUM_TENSORS];
    split_tensors(c, ref_all, ref);
#ifndef BF16_GRADS
    (void)flipped_share;
    double worst[NUM_TENSORS] = {0};
    long bad[NUM_TENSORS] = {0}, checked[NUM_TENSORS] = {0};
#else
    GradBlocks gb;
    grad_blocks_init(c, ref_all, &gb);
    BlockError *berr = (BlockError *)calloc_check(gb.nblocks, sizeof(BlockError));
    double rtol = BF16_BLOCK_RTOL + 2.0 * sqrt(2.0 * flipped_share);
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
                block_error_add(&berr[nb], g, r, gb.rms[nb], rtol / BF16_BLOCK_RTOL);
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
    block_errors_report(&gb, berr, rtol, 1);
    free(berr);
    grad_blocks_free(&gb);
#else
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (checked[i] == 0) { continue; }
        check(bad[i] == 0, "grad %-8s: %ld owned elements, %ld outside |g-ref| <= %.0e + %.0e|ref| (worst excess %.3e)",
              tensor_names[i], checked[i], bad[i], GRAD_ATOL, GRAD_RTOL, worst[i]);
    }
#endif
}

// --check-tolerance [--bf16-grads FILE]: the bf16 gradient tolerances (BF16_BLOCK_RTOL) applied to the full
// reference gradients, in any build. They pass the reference rounded to bf16 and a bf16 step emulated in
// PyTorch (FILE, from dev/reference/bf16_grads.py); they fail it with the q and k rows of qkvw zeroed (an
// attention backward that loses dq and dk: the per-element 1e-2 + 5e-2|ref| they replace passed that) in
// exactly those blocks, and with the whole qkv gradient zero.
static BlockError *block_errors(const GradBlocks *gb, const float *g, const float *ref, size_t n) {
    BlockError *e = (BlockError *)calloc_check(gb->nblocks, sizeof(BlockError));
    for (size_t i = 0; i < n; i++) {
        int b = (int)gb->number[i];
        block_error_add(&e[b], g[i], ref[i], gb->rms[b], 1.0);
    }
    return e;
}

static long old_tolerance_misses(const float *g, const float *ref, size_t n) {   // 1e-2 + 5e-2|ref|
    long bad = 0;
    for (size_t i = 0; i < n; i++) { bad += !(fabs((double)g[i] - ref[i]) <= 1e-2 + 5e-2 * fabs(ref[i])); }
    return bad;
}

static void check_zeroed_qkv(const ModelConfig *c, const GradBlocks *gb, const float *ref, float *g, int rows_zeroed) {
    size_t P = num_parameters(c), C = c->channels;
    float *t[NUM_TENSORS];
    memcpy(g, ref, P * sizeof(float));
    split_tensors(c, g, t);
    for (int l = 0; l < c->num_layers; l++) { memset(t[T_QKVW] + l * 3 * C * C, 0, rows_zeroed * C * C * sizeof(float)); }
    const float *ref_qkv = ref + (t[T_QKVW] - g);
    BlockError *e = block_errors(gb, g, ref, P);
    int flagged_zeroed = 0, flagged_other = 0, qkv_blocks = 0;
    for (int b = 0; b < gb->nblocks; b++) {
        int zeroed = gb->tensor[b] == T_QKVW && qkv_blocks++ % 3 < rows_zeroed;
        int flagged = !(block_ratio(gb, e, b) <= BF16_BLOCK_RTOL);
        if (zeroed) { flagged_zeroed += flagged; } else { flagged_other += flagged; }
    }
    check(flagged_zeroed == rows_zeroed * c->num_layers && flagged_other == 0,
          "bf16 tolerances, qkvw's first %d C rows zeroed in each layer: %d of the %d blocks zeroed fail, %d others "
          "(the per-element 1e-2 + 5e-2|ref| flags %ld of %zu elements)",
          rows_zeroed, flagged_zeroed, rows_zeroed * c->num_layers, flagged_other,
          old_tolerance_misses(t[T_QKVW], ref_qkv, tensor_full_size(c, T_QKVW)), tensor_full_size(c, T_QKVW));
    free(e);
}

static void check_tolerance(const ModelConfig *c, const float *ref, const char *emulated_path) {
    size_t P = num_parameters(c);
    GradBlocks gb;
    grad_blocks_init(c, ref, &gb);
    float *g = (float *)malloc_check(P * sizeof(float));
    for (size_t i = 0; i < P; i++) { g[i] = bf16_to_float(float_to_bf16(ref[i])); }
    BlockError *e = block_errors(&gb, g, ref, P);
    check(block_errors_report(&gb, e, BF16_BLOCK_RTOL, 0) == 0, "bf16 tolerances: the reference gradients rounded to bf16 pass (%d blocks)",
          gb.nblocks);
    free(e);
    if (emulated_path) {
        FILE *f = fopen_check(emulated_path, "rb");
        if (fread(g, sizeof(float), P, f) != P || fgetc(f) != EOF) {
            fail_all(my_rank, "--bf16-grads %s: expected %zu fp32 gradients (dev/reference/bf16_grads.py)", emulated_path, P);
        }
        fclose(f);
        if (my_rank == 0) { printf("bf16 tolerances on a bf16 step emulated in PyTorch (%s):\n", emulated_path); }
        e = block_errors(&gb, g, ref, P);
        block_errors_report(&gb, e, BF16_BLOCK_RTOL, 1);
        free(e);
    }
    check_zeroed_qkv(c, &gb, ref, g, 2);   // q and k: a lost dq, dk
    check_zeroed_qkv(c, &gb, ref, g, 3);   // the whole qkv gradient
    free(g);
    grad_blocks_free(&gb);
}
