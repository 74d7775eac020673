// Memory: the memory report against the formulas (parameters, gradients, optimizer state, activation slots, ZB's
// W store, the comm buffers and the logits) (--check-memory).
// Included by test_gpt.cu after its harness's first part (check(), the tolerances), as one translation unit.

// Memory report vs the formulas (X bytes per floatX). P is the number of this rank's (its pipeline
// stage's, tp-sliced, its experts') parameters, Psh its share under ZeRO: each unit divided by its
// data-parallel group (dp, or cp x dp with context parallelism; edp for the experts); padding is at
// most p-1 elements per unit.
static void check_memory_model(Model *m) {
    const ModelConfig *c = &m->config;
    Zero *z = &m->zero;
    int dp = m->grid->grad_group->size;
    double P = 0, Psh = 0, experts = 0;
    for (int u = 0; u < m->nunits; u++) {
        P += m->units[u].size;
        Psh += (double)m->units[u].size / m->units[u].dpg->size;
        if (m->units[u].dpg == &m->grid->edp_group) { experts += m->units[u].size; }
    }
    double pad = 4.0 * (m->nunits) * dp;    // bytes of padding at most, per buffer
    // Muon (muon.h): its elements keep one state (m), no v
    double muon = 0;
    for (int u = 0; u < m->nunits; u++) {
        size_t s0, n0, a, b;
        zero_owned_range(z, u, &s0, &n0);
        for (int k = 0; k < m->units[u].ntensors; k++) {
            if (m->units[u].t[k].muon && tensor_overlap(&m->units[u].t[k], s0, s0 + n0, &a, &b)) { muon += b - a; }
        }
    }
    double X = sizeof(floatX), opt_expect = (z->master ? 12.0 : 8.0) * (z->stage == 0 ? P : Psh) - 4.0 * muon;
    check(fabs((double)mem_current[MEM_OPTIMIZER] - opt_expect) <= 3 * pad,
          "memory: optimizer state %.0f B, formula %s%s = %.0f B (P_local %.0f, dp %d%s%.0f)",
          (double)mem_current[MEM_OPTIMIZER], z->stage == 0 ? "8P" : "8P/dp (experts: /edp)", muon > 0 ? " - 4 P_muon" : "",
          opt_expect, P, dp, muon > 0 ? ", Muon's elements " : "", muon);
    double max_layer = 0, embed = 0;   // (the embedding's work buffer: wte's, or an untied head's, the larger)
    for (int u = 0; u < m->nunits; u++) {
        double *big = m->units[u].embedding ? &embed : &max_layer;
        if (m->units[u].padded > *big) { *big = m->units[u].padded; }
    }
    double grads_expect = z->stage < 2 ? X * P : X * Psh + X * (2.0 * max_layer + embed);
    check(fabs((double)mem_current[MEM_GRADS] - grads_expect) <= 3 * pad,
          "memory: gradients %.0f B, formula %s = %.0f B", (double)mem_current[MEM_GRADS],
          z->stage < 2 ? "4P" : "4P/dp + transient(2 layers + embedding)", grads_expect);
    // (+ the routing bias of the stage's MoE layers, fp32: model state, not a parameter)
    double params_expect = (z->stage < 3 ? X * P : X * Psh + X * (2.0 * max_layer + embed))
            + 4.0 * m->moe.shape.nlayers * c->num_experts;
    check(fabs((double)mem_current[MEM_PARAMS] - params_expect) <= 3 * pad,
          "memory: parameters %.0f B, formula %s = %.0f B", (double)mem_current[MEM_PARAMS],
          z->stage < 3 ? "4P" : "4P/dp + gathered (2 layers + embedding)", params_expect);
    // MoE: each MoE layer of the stage holds E/ep experts, each 1/tp of an MLP (fcproj's bias whole)
    double C = c->channels;
    int nmoe = stage_moe_layers(m);
    if (nmoe > 0) {
        double El = (double)c->num_experts / m->grid->ep, Hl = m->moe.shape.Hl;
        double per_expert = c->arch == ARCH_LLAMA ? 3 * Hl * C             // (SwiGLU: gate, up, down; no biases)
                                                  : Hl * C + Hl + C * Hl + C;   // (width H: Hl = H/tp of it here)
        check(experts == nmoe * El * per_expert,
              "memory: expert parameters per rank %.0f = %d MoE layers x E/ep = %.0f experts x %.0f (1/tp of an MLP of width H)",
              experts, nmoe, El, per_expert);
    }
}

// The rows a MoE layer's dispatch sends (Rs) and receives (Rr) at most, the formula (0 without MoE layers on
// the stage): a token goes to at most k experts (min(k, E/ep) of one rank), a sequence at most cap times to
// one expert.
static void dispatch_rows_bound(Model *m, double *Rs, double *Rr) {
    const ModelConfig *c = &m->config;
    double E = c->num_experts, k = c->topk;
    *Rs = *Rr = 0;
    if (stage_moe_layers(m) == 0) { return; }
    double cap = moe_capacity(c->topk, m->T * m->grid->cp, c->num_experts, m->moe.shape.opt.cap1000), El = E / m->grid->ep;
    double kl = k < El ? k : El;
    *Rs = m->B * fmin(m->T * k, E * cap);
    *Rr = m->grid->ep * m->B * fmin(m->T * kl, El * cap);
    if (m->moe.dispatch.padded) { *Rs = *Rr = E * m->B * cap; }   // padded: E slots of B cap rows each way
}

// The activation slots: (micro-batch, chunk) pairs alive at once: 1F1B pp - stage, GPipe all m; interleaved (Megatron's
// count) 2(pp - stage - 1) + (vpp-1)pp warm-up forwards + 1, all m*vpp when m = pp: stage 0 holds pp + (pp-1)/vpp
// stages' worth. The step just run must have had that many alive at once (pipeline.h checks as it runs that no slot
// is taken twice).
static void check_memory_slots(Model *m, int accum) {
    int vpp = m->vpp, pp = m->grid->pp, s = m->grid->pp_rank, alive;
    if (pp == 1) { alive = 1; }
    else if (m->pipe.schedule == SCHEDULE_GPIPE) { alive = accum; }
    else if (m->pipe.schedule == SCHEDULE_1F1B) { alive = pp - s < accum ? pp - s : accum; }
    else if (m->pipe.schedule == SCHEDULE_ZB) { alive = pp < accum ? pp : accum; }   // (zb_store_formula)
    else { alive = accum == pp ? accum * vpp : 2 * (pp - s - 1) + (vpp - 1) * pp + 1; if (alive > accum * vpp) { alive = accum * vpp; } }
    check(m->pipe.nslots == alive,
          "memory: %d (micro-batch, chunk) activation slots, formula %d (%s, stage %d of %d, vpp %d, %d micro-batches)",
          m->pipe.nslots, alive,
              m->pipe.schedule == SCHEDULE_GPIPE ? "GPipe: all" : m->pipe.schedule == SCHEDULE_1F1B
                  ? "1F1B: pp - stage" : m->pipe.schedule == SCHEDULE_ZB ? "ZB: pp" :
          "interleaved: 2(pp-s-1) + (vpp-1)pp + 1", s, pp, vpp, accum);
}

// ZB's W store against its formula (0 without ZB): stage s runs pp-s-1 warm-up forwards, then holds up to s pending W
// passes (each keeping its micro-batch's slot) besides the micro-batch of its steady-state forward (a slot taken at
// the forward: the input waits in a buffer of its own): pp slots on every stage, 1F1B's peak. The pending W passes:
// s + 1 at most (right after a B, before its exchange runs the oldest), fewer when the steady state (m - warm-up
// steps) is shorter. Rr: the rows a MoE layer's experts may receive.
static double zb_store_formula(Model *m, int accum, double Rr) {
    const ModelConfig *c = &m->config;
    int Ls = m->Ls, nmoe = stage_moe_layers(m), pp = m->grid->pp, s = m->grid->pp_rank;
    double X = sizeof(floatX), BT = m->BT, C = c->channels, Cl = m->Cl;
    double wstore = 0;
    if (m->pipe.schedule == SCHEDULE_ZB && pp > 1) {
        int warm = pp - s - 1 < accum ? pp - s - 1 : accum, steady = accum - warm > 1 ? accum - warm : 1;
        int pending = s + 1 < steady ? s + 1 : steady;
        check(m->pipe.npending == pending, "memory: ZB keeps %d W passes pending at most, formula %d (stage %d of %d, "
              "%d micro-batches)", m->pipe.npending, pending, s, pp, accum);
        // per layer of the stage: the gradients of the outputs of attproj (BT, C) and qkv (BT, 3Cl), the LayerNorms'
        // parameter gradients (4C); SP or recompute full: ln2 and ln1 of all tokens (BT, C); full: the attention
        // output (BT, Cl). A dense layer: fcproj's and fc's output gradients (BT, C), (BT, 4Cl), recompute: the GELU
        // output (BT, 4Cl). A MoE layer: the shared experts' output and fc gradients (BT, C), (BT, SHl); the Rr rows'
        // output and fc gradients (Rr, C), (Rr, Hl); recompute: the rows' GELU output (Rr, Hl) and the shared
        // experts' (BT, SHl); full: the rows' input (Rr, C); the router logits' gradient (BT, E fp32)
        int full = m->recompute == RECOMPUTE_FULL, rec = m->recompute != RECOMPUTE_NONE, tp = m->grid->tp;
        double Hl = m->moe.shape.Hl, SHl = m->moe.shape.SHl, hs = C / c->num_heads, Fl = (double)c->ffn_hidden / tp;
        double qkv = (c->num_heads + 2.0 * c->kv_heads) / tp * hs, fc = c->arch == ARCH_LLAMA ? 2 * Fl : Fl;
        double qkn = c->qk_norm ? (c->num_heads + c->kv_heads) / tp * hs : 0;   // (+ QK-norm's weight gradients)
        double common = X * (BT * (C + qkv) + 4 * C + qkn + ((m->sp && m->grid->tp > 1) || full ? 2 * BT * C : 0) +
                             (full ? BT * Cl : 0));
        double dense_w = common + X * (BT * (C + fc) + (rec ? BT * Fl : 0));
        double hw = c->arch == ARCH_LLAMA ? 2 : 1;   // (SwiGLU: the gradients of [gate | up])
        double moe_w = common + X * ((SHl > 0 ? BT * (C + hw * SHl) : 0) + Rr * (C + hw * Hl) + (rec ? Rr * Hl + BT * SHl
                                     : 0) + (full ? Rr * C : 0)) + 4.0 * BT * (c->num_experts + c->shared_gate);
        wstore = Ls > 0 ? pending * ((Ls - nmoe) * dense_w + nmoe * moe_w) : 0;
    }
    return wstore;
}

// The bytes that every layer stores per micro-batch alive: the LayerNorm/residual tensors on BTs tokens, qkv and the
// attention output on BT tokens, the attention lse (BT, NH/tp); with QK-norm, q's and k's rows before the norm and
// their scales.
static double layer_core_bytes(Model *m) {
    const ModelConfig *c = &m->config;
    double X = sizeof(floatX), BT = m->BT, BTs = m->BTs, C = c->channels, Cl = m->Cl;
    // (Llama: RMSNorm keeps no mean; qkv rows of NH/tp query and KV/tp kv heads)
    // (QK-norm: q's and k's rows before the norm and their two scales per token)
    // (cp's all-to-all over U ranks leaves the head shard's qkv stored: with fewer kv heads per tp rank than U, each
    // replicated U/KV times, the rows NH/tp + 2U heads wide)
    int llama = c->arch == ARCH_LLAMA, tp = m->grid->tp, U = m->cpring.U, KVl = c->kv_heads / tp;
    double hs = C / c->num_heads;
    double qkv = ((double)c->num_heads / tp + 2.0 * (KVl % U == 0 ? KVl : U)) * hs;
    double core = X * 3.0 * BTs * C + 4.0 * (llama ? 2.0 : 4.0) * BTs + X * BT * (qkv + Cl) + 4.0 * BT * m->NHl;
    if (c->qk_norm) { core += X * BT * ((double)c->num_heads / tp + KVl) * hs + 4.0 * 2 * BT; }   // (q, k raw; scales)
    return core;
}

// The shape of a slot, which holds any chunk of the stage: the largest chunk's layers (Lmax), the most dense layers
// of a chunk (Ldmax), the layer positions where some chunk has a MoE layer (nmoe_pos).
static void slot_layer_counts(Model *m, int *Lmax_out, int *Ldmax_out, int *nmoe_pos_out) {
    const ModelConfig *c = &m->config;
    int Ls = m->Ls, vpp = m->vpp;
    int Lmax = 0, Ldmax = 0, nmoe_pos = 0;
    for (int l = 0, any; l < Ls; l++) {
        any = 0;
        for (int v = 0; v < vpp; v++) {
            int l0 = m->chunk_l0[v];
            any |= l0 + l < m->chunk_l0[v + 1] && is_moe_layer(c, m->layer_id[l0 + l]);
        }
        nmoe_pos += any;
    }
    for (int v = 0; v < vpp; v++) {
        int l0 = m->chunk_l0[v], Lc = m->chunk_l0[v + 1] - l0, Ldc = 0;
        for (int l = l0; l < l0 + Lc; l++) { Ldc += !is_moe_layer(c, m->layer_id[l]); }
        if (Lc > Lmax) { Lmax = Lc; }
        if (Ldc > Ldmax) { Ldmax = Ldc; }
    }
    *Lmax_out = Lmax;
    *Ldmax_out = Ldmax;
    *nmoe_pos_out = nmoe_pos;
}

// The activations (per micro-batch alive, and the recompute scratch) against their formula.
static void check_memory_activations(Model *m, int accum) {
    const ModelConfig *c = &m->config;
    int Ls = m->Ls, nmoe = stage_moe_layers(m);
    double X = sizeof(floatX), BT = m->BT, BTs = m->BTs, C = c->channels;
    // activations, per micro-batch alive (1F1B: pp - stage of them, GPipe: all): the LayerNorm/residual
    // parts on BTs tokens (BT/tp with SP), the rest on BT tokens; lnf and its gradient on the last stage;
    // a dense layer's MLP stores fc and GELU (BT, 4Cl); a MoE layer its routing and, for the Rr rows its
    // experts may receive, their input, fc and GELU (Rr, H/tp), and for the Rs rows it may send, their outputs;
    // with shared experts their fc and GELU (BT, S*H/tp)
    double Rs, Rr, E = c->num_experts, k = c->topk;
    dispatch_rows_bound(m, &Rs, &Rr);
    // per layer: the LayerNorm/residual tensors, qkv and attention output, the attention lse (layer_core_bytes); a
    // dense layer's fc and GELU outputs; a MoE layer's routing and expert rows, and its experts' fc and GELU
    // (SwiGLU's fc output [gate | up] 2F/tp, its activation F/tp; GPT-2: 3C/tp, 4C/tp and 4C/tp)
    int llama = c->arch == ARCH_LLAMA, tp = m->grid->tp;
    double Fl = (double)c->ffn_hidden / tp;
    double core = layer_core_bytes(m);
    // (a MoE layer: SwiGLU experts keep [gate | up] and their output, GELU ones fc and GELU; Qwen2-MoE's shared gate
    // one float per token)
    double hw = llama ? 3.0 : 2.0, sgate = c->shared_gate ? 4.0 * BT : 0;
    double dense_fc = X * BT * hw * Fl, route = 4.0 * (BT * E + BT + 4 * BT * k + m->B * E) + X * (Rr * C + Rs * C) + sgate;
    double hidden = X * hw * (Rr * m->moe.shape.Hl + BT * m->moe.shape.SHl), Ld = Ls - nmoe;
    // --recompute: what is recomputed is not stored per micro-batch; one layer of it lives in a scratch
    double scratch;
    if (m->recompute == RECOMPUTE_NONE) { scratch = 0; }
    else if (m->recompute == RECOMPUTE_MLP) { scratch = (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? hidden : 0); }
    else { scratch = (Ls > 0 ? core : 0) + (Ld > 0 ? dense_fc : 0) + (nmoe > 0 ? route + hidden : 0); }
    check_memory_slots(m, accum);
    double wstore = zb_store_formula(m, accum, Rr);
    check(m->pipe.peak == m->pipe.nslots, "memory: the step run had %d pairs alive at once, the %d slots",
          m->pipe.peak, m->pipe.nslots);
    // a slot holds any chunk of the stage: the largest chunk's layers, a dense layer's fc at as many
    // positions as the most dense layers of a chunk, a MoE layer's tensors at each position where a chunk has one
    int Lmax, Ldmax, nmoe_pos;
    slot_layer_counts(m, &Lmax, &Ldmax, &nmoe_pos);
    // the residual stream, lnf (last stage), tokens (first stage) and targets (last stage)
    double stage = X * (Lmax + 1) * BTs * C + (m->last ? X * 2 * BTs * C + 4.0 * (llama ? 1 : 2) * BTs
                                               : 0) + 4.0 * BT * (m->first + m->last);
    double per_micro = stage + (m->recompute == RECOMPUTE_FULL ? 0 : Lmax * core) +
                       (m->recompute == RECOMPUTE_NONE ? Ldmax * dense_fc + nmoe_pos * hidden
                        : 0) + (m->recompute != RECOMPUTE_FULL ? nmoe_pos * route : 0);
    double act_expect = scratch + per_micro * m->pipe.nslots + wstore;
    static const char *modes[3] = {"none", "mlp", "full"};
    check(fabs((double)mem_current[MEM_ACTIVATIONS] - act_expect) < 1,
          "memory: activations %.0f B, formula %.0f B (%d slots x %.0f + recompute scratch %.0f + ZB's pending W %.0f; "
          "BTs %d, recompute %s)", (double)mem_current[MEM_ACTIVATIONS], act_expect, m->pipe.nslots, per_micro, scratch,
          wstore, m->BTs, modes[m->recompute]);
}

// The comm buffers and the logits against their formulas.
static void check_memory_buffers(Model *m) {
    double X = sizeof(floatX), BT = m->BT, BTs = m->BTs, C = m->config.channels, Rs, Rr;
    int vpp = m->vpp;
    dispatch_rows_bound(m, &Rs, &Rr);
    // comm buffers: MoE's dispatch buffers, send and receive, at their worst case (ep > 1); with a pipeline and
    // --overlap, the copy of the input's gradient being sent (but on the first stage, without
    // interleaving); interleaved, where a received gradient waits for its backward
    double grad_copy = m->pipe.overlap && (!m->first || vpp > 1) ? X * BTs * C : 0,
        grad_wait = vpp > 1 ? X * BTs * C : 0;
    // ZB (not the first stage): where a received input waits for its forward
    double input_wait = m->pipe.schedule == SCHEDULE_ZB && m->grid->pp > 1 && !m->first ? X * BTs * C : 0;
    // context parallelism: ring attention's keys and values (B, T/cp, 2 KV hs/tp), held and arriving, and their
    // gradients; with all-to-alls over U ranks (Ulysses, the hybrid) a send and a receive buffer of the local qkv
    // rows (B, T/cp, (NH + 2 U Hkv) hs/tp: KV/tp kv heads, or U replicated ones), and the hybrid's ring carries the
    // head shard's kv heads for the U T/cp tokens of its group: (B, T/cp, 2 U Hkv hs/tp) again
    int U = m->cpring.U, KVl = m->config.kv_heads / m->grid->tp, N = m->grid->cp / U;
    double hs = C / m->config.num_heads, Ckv = (KVl % U == 0 ? KVl : U) * hs;
    double ring = m->grid->cp > 1 && N > 1 ? 4.0 * X * BT * 2 * Ckv : 0;
    double a2a = m->grid->cp > 1 && U > 1 ? 2.0 * X * BT * (m->Cl + 2 * Ckv) : 0;
    // Muon: the all-to-alls' send buffer (the larger of what it sends: its shard partition's Muon elements, and what it
    // serves as owner: its matrices' elements once per rank that updates them, the unit's whole group at ZeRO 0) and
    // receive buffer (the larger of its matrices' elements, received once, and what it updates), a float each (+1),
    // and the moves' pieces (a matrix's part of a rank's tp slice and range: a few per matrix)
    double muon_comm = 0;
    if (m->muon.world) {
        const Muon *mu = &m->muon;
        const Zero *z = &m->zero;
        double n = (double)(z->opt_size - z->v_size), mats = 0, serve = 0, send = 0;
        for (int i = 0; i < mu->nmat; i++) {
            const MuonMatrix *a = &mu->mat[i];
            if (a->owner != m->grid->rank) { continue; }
            int copies = z->stage > 0 ? 1 : tensor_spec(&m->config, a->id).experts ? m->grid->edp_group.size
                                                                                    : m->grid->grad_group->size;
            mats += (double)a->rows * a->cols;
            serve += (double)a->rows * a->cols * copies;
        }
        for (int u = 0; u < m->nunits; u++) {   // the shard partition's part of the owned Muon elements
            const Unit *U = &m->units[u];
            size_t s0 = (size_t)U->dpg->rank * U->shard, a, b;
            for (int k = 0; k < U->ntensors; k++) {
                if (U->t[k].muon && tensor_overlap(&U->t[k], s0, s0 + U->shard, &a, &b)) { send += b - a; }
            }
        }
        double pieces = mu->send.npieces + mu->recv.npieces + mu->serve.npieces + mu->need.npieces + 4.0;
        muon_comm = 4.0 * (fmax(send, serve) + 1 + fmax(mats, n) + 1) + sizeof(MuonPiece) * pieces;
    }
    double comm_expect = X * (m->grid->ep > 1 ? Rs + Rr : 0) * C + grad_copy + grad_wait + input_wait + ring + a2a + muon_comm;
    check(fabs((double)mem_current[MEM_COMM] - comm_expect) < 1,
          "memory: comm buffers %.0f B = MoE dispatch (Rs %.0f + Rr %.0f rows) x C x %d B + pipeline gradient copy %.0f B + waiting gradient %.0f B + waiting input %.0f B + cp ring 4 x (B, T/cp, 2 KV hs/tp) %.0f B + cp all-to-all 2 x (B, T/cp, (NH + 2KV) hs/tp) %.0f B + Muon's buffers and pieces %.0f B",
          (double)mem_current[MEM_COMM], Rs, Rr, (int)X, grad_copy, grad_wait, input_wait, ring, a2a, muon_comm);
    // logits (last stage): one chunk of chunk x Vp/tp, never B*T x Vp (plus per-token stats and losses)
    double logits_expect = m->last
            ? X * m->ce.chunk * m->Vl + 4.0 * (3.0 * m->ce.chunk * (1 + m->grid->tp) + BT) + 8.0 : 0;
    check(fabs((double)mem_peak[MEM_LOGITS] - logits_expect) < 1,
          "memory: logits peak %.0f B = chunk %d x Vp/tp %d x %d B + stats/losses/their sum (%.0f B)",
          (double)mem_peak[MEM_LOGITS], m->ce.chunk, m->Vl, (int)X, logits_expect);
}
