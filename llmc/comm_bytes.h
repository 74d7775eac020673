// The bytes one rank sends in a training step, per group, by formula: the ring algorithms' counts (comm.h
// counts each collective as the bytes one rank sends: all-reduce 2(p-1)/p n, reduce-scatter and all-gather
// (p-1)/p n, point-to-point and all-to-all what leaves the rank). One function, comm_step_bytes, that
// test_gpt asserts equal to what a run counted (every layout of the matrix), and that the memory plan's cost
// model and the layout search (plan.h, layout_search.h) time. Its inputs, CommShape, are the rank's shapes
// as the model set them up (train_gpt.cu's gpt2_comm_shape, from a run or from a plan).
#ifndef LLMC_COMM_BYTES_H
#define LLMC_COMM_BYTES_H

typedef struct {
    double X;                           // bytes per element (floatX)
    int tp, cp, pp, sp, vpp, first, last;   // the grid; this rank's stage: first / last, model chunks
    int zero, dp, edp, ep;              // ZeRO stage; the sizes of the gradients' group (dp, or dp x cp), the
                                        // experts' (edp) and ep
    int B, BT, BTs, C, Cl, Ls;          // BT = B*T/cp tokens of the rank, BTs its LayerNorm/residual slice (SP:
                                        // BT/tp), Cl = C/tp, Ls the stage's layers
    int ce_chunk, recompute_full;
    int nmoe, moe_layers, topk, E, El, capped, padded, cap, bias;   // MoE: the stage's MoE layers, the model's;
                                        // capped: a capacity below T (cp shares the sequences' assignments);
                                        // padded dispatch (cap rows per slot); loss-free balancing on
    // ZeRO: padded elements of the units (zero.h), by group: [0] reduced over dp, [1] over edp (the experts)
    double units[2], rep;               // rep: replicated over tp, partial sums under SP (LayerNorms, biases)
    double embed_padded, embed_shard;   // the tied embedding's unit with a pipeline (0: none on this stage)
    // ZeRO-3's gathers, ring elements per group [2] ((p-1)/p x padded): once per step, per micro-batch, and
    // saved between two micro-batches (units still gathered); exact = 1 where the policy's count is exact (no
    // pipeline, no MoE: zero_unit_params), else an upper bound (every use of a unit gathered)
    double z3_step[2], z3_micro[2], z3_between[2];
    int z3_exact;
    // the calls: units per group [2], units with replicated elements (SP's all-reduce over tp), and ZeRO-3's
    // gathers per group as the ring elements above count them (once per step, per micro-batch, saved between)
    int nunits[2], nrep_units;
    double z3n_step[2], z3n_micro[2], z3n_between[2];
} CommShape;

typedef struct { double tp, cp, pp, dp, edp, ep, emb; } CommBytes;   // bytes per step, one rank's

// The rows the MoE all-to-alls move per step when the routing spreads the assignments evenly over the
// experts (padded dispatch: exactly, whatever the routing): to and from the other ep ranks, every MoE
// layer and micro-batch, counted once each way (forward dispatch + return is 2x; comm_step_bytes adds the
// backward and the recomputation).
static double comm_ep_rows_even(const CommShape *s, int accum) {
    if (s->ep == 1 || s->nmoe == 0) { return 0; }
    if (s->padded) { return (double)s->nmoe * accum * 2.0 * (s->ep - 1) * s->El * s->B * s->cap; }
    return (double)s->nmoe * accum * 2.0 * s->BT * s->topk * (s->ep - 1.0) / s->ep;
}

// One step of `accum` micro-batches. ep_rows: the rows the all-to-alls moved (a run counts them from its
// routing; a plan: comm_ep_rows_even). gathered[2]: ZeRO-3's ring elements gathered per group, as a run
// counted them (NULL: from the shape's policy: exact or the bound, see CommShape).
static CommBytes comm_step_bytes(const CommShape *s, int accum, double ep_rows, const double *gathered) {
    CommBytes b = {0, 0, 0, 0, 0, 0, 0};
    double X = s->X;
    // dp and edp: ZeRO's reductions and gathers, per group
    int p[2] = {s->dp, s->edp};
    double balance = s->bias ? 2.0 * (s->dp - 1) / s->dp * 4.0 * s->moe_layers * s->E : 0;   // the loads (ints)
    double *out[2] = {&b.dp, &b.edp};
    for (int i = 0; i < 2; i++) {
        if (p[i] == 1 || s->units[i] == 0) { continue; }
        double ring = (p[i] - 1.0) / p[i] * X * s->units[i];   // one reduce-scatter, or one all-gather
        if (s->zero < 2) { *out[i] = 2.0 * ring; }                  // all-reduce (0), or RS + AG of the params (1)
        else if (s->zero == 2) { *out[i] = ring * (accum + 1); }    // RS per micro-batch + AG of the params
        else {                                                      // gathers + RS per micro-batch
            double g = gathered ? gathered[i]
                    : s->z3_step[i] + accum * s->z3_micro[i] - (accum - 1.0) * s->z3_between[i];
            *out[i] = X * g + accum * ring;
        }
    }
    b.dp += balance;   // loss-free balancing: the step's loads (MoE layers, E) ints all-reduced
    // emb: the tied embedding's gradient summed over the two end stages (an all-reduce over 2 ranks: n)
    if (s->pp > 1 && s->embed_padded > 0) { b.emb = X * (s->zero == 0 ? s->embed_padded : s->embed_shard); }
    // pp: each micro-batch and model chunk, the output activation forward (but the last stage's last chunk) and
    // the input gradient back (but the first stage's chunk 0); without SP each tp rank sends 1/tp of it
    if (s->pp > 1) {
        double slice = (double)s->BTs * s->C / (!s->sp && s->tp > 1 ? s->tp : 1);
        b.pp = accum * X * slice * ((s->vpp - s->last) + (s->vpp - s->first));
    }
    // cp: ring attention, per layer and micro-batch: N-1 hops of k, v forward (again when recomputed), N-1 of
    // k, v and N of dk, dv backward, each (B, T/cp, 2C/tp); MoE, per layer and forward (again when
    // recomputed): the sequences' other assignments for the capacity all-gathered ((B, T/cp, k) ints and
    // floats; not when dropless), and f all-reduced ((B, E) floats)
    if (s->cp > 1) {
        int N = s->cp, hops = (N - 1) + (s->recompute_full ? N - 1 : 0) + (N - 1) + N, fwd = s->recompute_full ? 2 : 1;
        double kv = X * s->BT * 2.0 * s->Cl;
        double moe = s->nmoe * fwd * ((s->capped ? 2.0 * (N - 1) * s->BT * s->topk * 4 : 0)
                                      + 2.0 * (N - 1) / N * s->B * s->E * 4);
        b.cp = (double)accum * (s->Ls * hops * kv + moe);
    }
    // ep: the rows x C each way, forward (dispatch, return), backward (the same), and the recomputed forward
    if (s->ep > 1 && s->nmoe > 0) { b.ep = (s->recompute_full ? 3 : 2) * ep_rows * s->C * X; }
    // tp, per micro-batch: 4 collectives per layer of the stage, plus the embedding (first stage) and the head
    // (last stage): SP (ends+4L) reduce-scatters + (ends+6L) all-gathers of (p-1)/p BT C (2L of them the
    // backward's re-gathers), without SP (ends+4L) all-reduces; recompute full: each layer's forward
    // collectives again; the CE chunks' statistics (3 floats a token over the tp ranks); MoE: the gates'
    // gradient (BT, k) fp32 all-reduced per MoE layer; a pipeline without SP: the stage boundary tensors, of
    // which each tp rank received 1/tp, all-gathered; SP: the replicated elements' partial-sum gradients
    // all-reduced once per step (ZeRO-2/3: per micro-batch)
    if (s->tp > 1) {
        double S = X * s->BT * s->C, ring = (s->tp - 1.0) / s->tp, ends = s->first + s->last;
        double act = (2 * ends + (s->sp ? 10.0 : 8.0) * s->Ls) * ring * S;
        if (s->recompute_full) { act += 4.0 * s->Ls * ring * S; }
        double ce = 0;
        for (int c0 = 0; s->last && c0 < s->BT; c0 += s->ce_chunk) {
            int n = s->BT - c0 < s->ce_chunk ? s->BT - c0 : s->ce_chunk;
            ce += (s->tp - 1.0) * 3 * n * 4;
        }
        double pipe_ag = s->pp > 1 && !s->sp
                ? ((s->vpp - s->first) + (s->vpp - s->last)) * ring * S * s->BTs / s->BT : 0;
        double gates = s->nmoe * 2.0 * ring * s->BT * s->topk * 4;
        double rep = s->sp ? 2.0 * ring * X * s->rep * (s->zero >= 2 ? accum : 1) : 0;
        b.tp = accum * (act + ce + pipe_ag + gates) + rep;
    }
    return b;
}

// The calls one rank makes in a training step, per group: the collectives comm_step_bytes counts the bytes of,
// each counted once (a point-to-point exchange: each message sent), as comm.h counts Group.calls. What a
// collective's latency costs (plan.h) is per call, whatever its size. gathered[2]: ZeRO-3's gathers per group as
// a run counted them (NULL: from the shape's policy, as comm_step_bytes).
static CommBytes comm_step_calls(const CommShape *s, int accum, const double *gathered) {
    CommBytes n = {0, 0, 0, 0, 0, 0, 0};
    // dp and edp: per unit, an all-reduce (ZeRO 0), a reduce-scatter and an all-gather (1), a reduce-scatter per
    // micro-batch and an all-gather (2), the gathers and a reduce-scatter per micro-batch (3)
    int p[2] = {s->dp, s->edp};
    double *out[2] = {&n.dp, &n.edp};
    for (int i = 0; i < 2; i++) {
        if (p[i] == 1 || s->units[i] == 0) { continue; }
        double u = s->nunits[i];
        if (s->zero == 0) { *out[i] = u; }
        else if (s->zero == 1) { *out[i] = 2 * u; }
        else if (s->zero == 2) { *out[i] = u * (accum + 1); }
        else {
            double g = gathered ? gathered[i] : s->z3n_step[i] + accum * s->z3n_micro[i] - (accum - 1.0) * s->z3n_between[i];
            *out[i] = g + accum * u;
        }
    }
    if (s->bias && s->dp > 1) { n.dp += 1; }   // loss-free balancing's loads
    if (s->pp > 1 && s->embed_padded > 0) { n.emb = 1; }
    if (s->pp > 1) { n.pp = accum * ((s->vpp - s->last) + (s->vpp - s->first)); }
    // cp: a message per hop; MoE: the capacity's two all-gathers (capped) and f's all-reduce, per forward
    if (s->cp > 1) {
        int N = s->cp, hops = (N - 1) + (s->recompute_full ? N - 1 : 0) + (N - 1) + N, fwd = s->recompute_full ? 2 : 1;
        n.cp = (double)accum * (s->Ls * hops + s->nmoe * fwd * ((s->capped ? 2 : 0) + 1));
    }
    // ep: dispatch and return, forward, backward (and the recomputed forward)
    if (s->ep > 1 && s->nmoe > 0) { n.ep = (double)accum * s->nmoe * 2 * (s->recompute_full ? 3 : 2); }
    // tp, per micro-batch: SP 2 per end and 10 per layer (recompute full: 4 more), without SP 1 per end and 4 per
    // layer (2 more); a CE chunk's statistics; MoE's gates; the stage boundaries' gathers (a pipeline without SP);
    // SP's replicated gradients, per unit that has some, once per step (ZeRO-2/3: per micro-batch)
    if (s->tp > 1) {
        double ends = s->first + s->last, act;
        if (s->sp) { act = 2 * ends + 10.0 * s->Ls + (s->recompute_full ? 4.0 * s->Ls : 0); }
        else { act = ends + 4.0 * s->Ls + (s->recompute_full ? 2.0 * s->Ls : 0); }
        double ce = s->last ? (s->BT + s->ce_chunk - 1) / s->ce_chunk : 0;
        double pipe_ag = s->pp > 1 && !s->sp ? (s->vpp - s->first) + (s->vpp - s->last) : 0;
        double rep = s->sp ? (double)s->nrep_units * (s->zero >= 2 ? accum : 1) : 0;
        n.tp = accum * (act + ce + pipe_ag + s->nmoe) + rep;
    }
    return n;
}

#endif // LLMC_COMM_BYTES_H
