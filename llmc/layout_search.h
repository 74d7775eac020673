// Choosing a layout, from the memory plan (plan.h) and the cost model (cost_model.h): --plan N's report (each
// stage's peak, the predicted step, and over --memory-limit the levers: one change of the layout at a time, or
// pairs, ranked by fit and time), the check a run makes before it allocates, and the layout search
// (--plan-search N): every layout of N ranks for this model and global batch (-d and -t fixed) -- tp, cp, pp with
// its schedule and split, dp, ep, the ZeRO stage, SP, recompute, the micro-batch B and the CE chunk -- checked by
// the run's own layout_error, planned exactly per stage, its bytes per group by the formulas test_gpt asserts, and
// timed. Prints the fastest that fit, and why the others do not run.
#ifndef LLMC_LAYOUT_SEARCH_H
#define LLMC_LAYOUT_SEARCH_H

#include "plan.h"
#include "cost_model.h"

// ----------------------------------------------------------------------------
// the levers: one change of a layout at a time (or pairs), planned and timed (--plan N over --memory-limit)

// A change of the layout: what (the flags), its kind (one flag: a pair changes two different ones), its
// layout, worst stage's peak, time per step, and whether it fits.
typedef struct { char what[96]; int kind; Layout lay; double peak; double seconds; int fits; } Lever;
enum { LV_ZERO, LV_SP, LV_TP, LV_PP, LV_SCHEDULE, LV_SPLIT, LV_CP, LV_CE, LV_ATTENTION, LV_RECOMPUTE, LV_BATCH, LV_EP };

// One lever's layout, if it runs: its worst stage's peak and its time.
static int try_lever(Lever *lv, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b, const Machine *mc,
                     double limit, const char *what) {
    char err[512];
    lv->lay.dp = -1;   // (world and -d fixed: dp follows)
    if (layout_error(&lv->lay, c, world, err, sizeof(err))) { return 0; }
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * lv->lay.pp);
    CommShape *shapes = (CommShape *)malloc_check(sizeof(CommShape) * lv->lay.pp);
    int w = plan_stages(&lv->lay, c, moe, world, b, plans, shapes);
    lv->peak = (double)plans[w].peak_total + plan_reserve(b);
    lv->fits = lv->peak <= limit;
    lv->seconds = plan_step_time(&lv->lay, c, world, mc, shapes).total;
    snprintf(lv->what, sizeof(lv->what), "%s", what);
    free(plans);
    free(shapes);
    return 1;
}

static int lever_order(const void *x, const void *y) {
    const Lever *a = (const Lever *)x, *b = (const Lever *)y;
    if (a->fits != b->fits) { return b->fits - a->fits; }
    return a->seconds < b->seconds ? -1 : a->seconds > b->seconds;
}

// The single levers that apply to layout lay (world and -d fixed), planned, into out; returns their number.
static int plan_single_levers(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b,
                              const Machine *mc, double limit, Lever *out) {
    int n = 0;
    #define LEVER(cond, k, what, change) do { \
        if (cond) { \
            Lever lv; lv.lay = *lay; lv.kind = k; \
            { Layout *x = &lv.lay; change; } \
            if (try_lever(&lv, c, moe, world, b, mc, limit, what)) { out[n++] = lv; } \
        } } while (0)
    char w[96];
    if (lay->zero < 3 && lay->dp > 1) {   // (ZeRO shards over dp: nothing to shard at dp 1)
        snprintf(w, sizeof(w), "--zero %d", lay->zero + 1);
        LEVER(1, LV_ZERO, w, x->zero = lay->zero + 1);
    }
    LEVER(lay->tp > 1 && !lay->sp, LV_SP, "--sp", x->sp = 1);
    snprintf(w, sizeof(w), "--tp %d --sp", 2 * lay->tp); LEVER(1, LV_TP, w, { x->tp = 2 * lay->tp; x->sp = 1; });
    // (a split given as counts is for this pp: twice the stages start even)
    int counts = lay->pp_layers && strncmp(lay->pp_layers, "auto", 4);
    snprintf(w, sizeof(w), "--pp %d%s", 2 * lay->pp, counts ? " (even stages)" : "");
    LEVER(1, LV_PP, w, { x->pp = 2 * lay->pp; if (counts) { x->pp_layers = NULL; } });
    LEVER(lay->pp > 1 && !strcmp(lay->pp_schedule, "gpipe"), LV_SCHEDULE, "--pp-schedule 1f1b", x->pp_schedule = "1f1b");
    // ZB-H1: a smaller bubble for the pending W passes' memory (a lever for time: it never lowers the peak)
    LEVER(lay->pp > 1 && !strcmp(lay->pp_schedule, "1f1b"), LV_SCHEDULE, "--pp-schedule zb", x->pp_schedule = "zb");
    // stages cut by cost: less on the costliest stage (the head's), and the first stage's activations move too
    LEVER(lay->pp > 1 && !(lay->pp_layers && !strncmp(lay->pp_layers, "auto", 4)), LV_SPLIT, "--pp-layers auto",
          x->pp_layers = "auto");
    snprintf(w, sizeof(w), "--cp %d", 2 * lay->cp); LEVER(1, LV_CP, w, x->cp = 2 * lay->cp);
    LEVER(lay->ce_chunk == 0, LV_CE, "--ce-chunk 256", x->ce_chunk = 256);
    if (lay->ce_chunk > 64) {
        snprintf(w, sizeof(w), "--ce-chunk %d", lay->ce_chunk / 2);
        LEVER(1, LV_CE, w, x->ce_chunk = lay->ce_chunk / 2);
    }
    LEVER(b.cuda && lay->cp == 1 && strcmp(lay->attention, "flash")
          && attention_flash_applies(c->channels / c->num_heads, b.floatx),
          LV_ATTENTION, "--attention flash", x->attention = "flash");
    LEVER(!strcmp(lay->recompute, "none"), LV_RECOMPUTE, "--recompute mlp", x->recompute = "mlp");
    LEVER(strcmp(lay->recompute, "full"), LV_RECOMPUTE, "--recompute full", x->recompute = "full");
    if (lay->B % 2 == 0) {
        snprintf(w, sizeof(w), "-b %d (twice the accumulation)", lay->B / 2);
        LEVER(1, LV_BATCH, w, x->B = lay->B / 2);
    }
    if (c->num_experts > 0) { snprintf(w, sizeof(w), "--ep %d", 2 * lay->ep); LEVER(1, LV_EP, w, x->ep = 2 * lay->ep); }
    #undef LEVER
    return n;
}

// The single levers that apply to layout lay (world and -d fixed), planned; without one that fits, pairs.
static int plan_levers(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b,
                       const Machine *mc, double limit, Lever *out, int pairs_of) {
    int n = plan_single_levers(lay, c, moe, world, b, mc, limit, out);
    if (pairs_of) {   // no single lever fits: each pair of two kinds (the second applied on top of the first), once
        int singles = n;
        for (int i = 0; i < singles; i++) {
            Lever more[16];
            int k = plan_levers(&out[i].lay, c, moe, world, b, mc, limit, more, 0);
            for (int j = 0; j < k && n < 256; j++) {
                if (more[j].kind <= out[i].kind) { continue; }   // (the same flag twice, or this pair the other way round)
                char both[96];
                snprintf(both, sizeof(both), "%.40s + %.40s", out[i].what, more[j].what);
                memcpy(more[j].what, both, sizeof(both));
                out[n++] = more[j];
            }
        }
        memmove(out, out + singles, (n - singles) * sizeof(Lever));
        n -= singles;
    }
    return n;
}

// Over the limit: the largest category of the worst stage, what dominates it, and the levers (single ones,
// or pairs when none fits) ranked by fit and time, with the machine-readable "lever ..." lines.
static void plan_print_advice(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b,
                              const Machine *mc, double limit, const MemPlan *plans, const CommShape *shapes, int worst) {
    int big = 0;
    for (int k = 1; k < MEM_NCAT; k++) { if (plans[worst].peak[k] > plans[worst].peak[big]) { big = k; } }
    char why[256];
    plan_explain(lay, c, world, worst, big, b, plans[worst].slots, why, sizeof(why));
    printf("largest on stage %d: %s = %.2f GiB\n", worst, mem_category_names[big], gib(plans[worst].peak[big]));
    printf("  %s\n", why);
    Lever *levers = (Lever *)malloc_check(sizeof(Lever) * 256);
    int n = plan_levers(lay, c, moe, world, b, mc, limit, levers, 0), any = 0;
    for (int i = 0; i < n; i++) { any |= levers[i].fits; }
    if (!any) { n = plan_levers(lay, c, moe, world, b, mc, limit, levers, 1); }
    qsort(levers, n, sizeof(Lever), lever_order);
    printf("levers (%s; world %d and -d %d fixed, so tp, cp or pp x2 halves dp), fits first, then fastest; the time "
           "per step is the cost model's (%s: %.0f TFLOP/s, %.0f GB/s inside a node of %d, %.0f GB/s across; "
           "the schedule's own bubble): it ranks the levers, it is not this machine's step%s:\n",
           any ? "one at a time" : "no single lever fits: pairs of two", world, lay->total_batch, mc->name,
           mc->flops / 1e12, mc->node_bw / 1e9, mc->gpus_per_node, mc->net_bw / 1e9,
           b.cuda || mc->cores > 0 ? "" : " (a CPU rank runs far slower)");
    for (int i = 0; i < n && i < 12; i++) {
        printf("  %-8s %9.3f GiB  %10.2f ms/step  %s\n", levers[i].fits ? "fits" : "too big", gib(levers[i].peak),
               levers[i].seconds * 1e3, levers[i].what);
    }
    for (int i = 0; i < n; i++) {   // machine-readable, for tests: "lever rank fits peak_bytes seconds what"
        printf("lever %d %d %.0f %.6f %s\n", i, levers[i].fits, levers[i].peak, levers[i].seconds, levers[i].what);
    }
    if (n == 0) { printf("  (no lever applies to this layout)\n"); }
    printf("  (this layout: %.2f ms/step)\n", plan_step_time(lay, c, world, mc, shapes).total * 1e3);
    free(levers);
}

// Prints the plan of every stage and, with a limit, whether each fits; over the limit, what dominates
// and the levers. Returns 1 if every rank fits (or there is no limit).
static int plan_report(const Layout *lay, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b, Machine mc,
                       double limit) {
    MemPlan *plans = (MemPlan *)malloc_check(sizeof(MemPlan) * lay->pp);
    CommShape *shapes = (CommShape *)malloc_check(sizeof(CommShape) * lay->pp);
    int worst = plan_stages(lay, c, moe, world, b, plans, shapes), accum = layout_accum(lay);
    double reserve = plan_reserve(b);
    char kind[48] = "";
    int U = cp_ulysses_degree(lay);
    if (U > 1) { snprintf(kind, sizeof(kind), " (%s, all-to-all in %d)", lay->cp_kind, U); }
    printf("memory plan: L %d C %d NH %d Vp %d%s, world %d = tp %d x cp %d%s x pp %d x dp %d, B %d T %d x %d "
           "micro-batches, zero %d%s, %s%s, recompute %s, ce chunk %d; %s\n",
           c->num_layers, c->channels, c->num_heads, c->padded_vocab_size, c->num_experts ? " (MoE)" : "", world, lay->tp,
           lay->cp, kind, lay->pp, lay->dp, lay->B, lay->T, accum, lay->zero, lay->sp ? ", sp" : "", lay->pp_schedule,
           lay->vpp > 1 ? " (vpp)" : "", lay->recompute, lay->ce_chunk, b.name);
    plan_print_stages(lay, c, moe, world, b, plans);
    StepTime t = plan_step_time(lay, c, world, &mc, shapes);
    printf("predicted step: %.3f ms (cost model, %s: compute %.3f, bubble %.3f, exposed tp %.3f cp %.3f ep %.3f pp "
           "%.3f dp %.3f, AdamW %.3f; slowest stage %d)\n", t.total * 1e3, mc.name, t.compute * 1e3, t.bubble * 1e3,
           t.tp * 1e3, t.cp * 1e3, t.ep * 1e3, t.pp * 1e3, t.dp * 1e3, t.optimizer * 1e3, t.stage);
    int fits = 1;
    if (limit > 0) {
        double need = (double)plans[worst].peak_total + reserve;
        fits = need <= limit;
        printf("limit %.2f GiB per rank%s: stage %d needs %.2f GiB: %s\n", gib(limit),
               reserve > 0 ? " (1.00 GiB of it assumed for the CUDA context and NCCL)" : "", worst, gib(need),
                   fits ? "fits" : "does NOT fit");
    }
    if (!fits) { plan_print_advice(lay, c, moe, world, b, &mc, limit, plans, shapes, worst); }
    fflush(stdout);
    free(plans);
    free(shapes);
    return fits;
}



// Before allocating: this rank's planned peak against --memory-limit (on CUDA, without one: the free device
// memory, less the reserve the plan assumes for the CUDA context and NCCL). If any rank does not fit, every
// rank stops; rank 0 prints the plan and the levers first.
// memory_limit: --memory-limit (0: none); machine, gpus_per_node: --machine, --gpus-per-node (for the levers' times).
static void check_memory_fits(const Layout *lay, const ModelConfig *c, MoEOptions moe, Grid *g, PlanBuild b,
                              double memory_limit, const char *machine, int gpus_per_node) {
    double limit = memory_limit > 0 ? memory_limit : device_free_bytes();
    if (limit <= 0) { return; }
    MemPlan mine = plan_rank(lay, c, moe, g->world_size, g->rank, b, NULL);
    double need = (double)mine.peak_total + (memory_limit > 0 ? plan_reserve(b) : 0.0);
    int over = need > limit ? 1 : 0;
    comm_host_all_reduce(&g->world, &over, 1, DT_INT, HOST_MAX, "all-reduce (memory plan)");
    if (!over) { return; }
    if (g->rank == 0) { plan_report(lay, c, moe, g->world_size, b, plan_machine(machine, gpus_per_node), limit); }
    fail_all(g->rank,
             "the planned peak of a rank exceeds %s %.2f GiB: see the plan and the levers above (or --plan %d to "
             "explore)",
             memory_limit > 0 ? "--memory-limit" : "the free device memory", gib(limit), g->world_size);
}

// ----------------------------------------------------------------------------
// the search

// One layout tried (the command line's, with what the search varies), its worst stage's peak and its time.
typedef struct {
    Layout lay;
    double peak;
    StepTime t;
    long id;   // the enumeration's order (ties keep it)
} Candidate;

// The flags that give layout x (beside the command line's model, -t and -d).
static void layout_flags(const Layout *x, char *out, size_t n) {
    int o = snprintf(out, n, "-b %d", x->B), U = cp_ulysses_degree(x);
    if (x->tp > 1) { o += snprintf(out + o, n - o, " --tp %d%s", x->tp, x->sp ? " --sp" : ""); }
    if (x->cp > 1) { o += snprintf(out + o, n - o, " --cp %d", x->cp); }
    if (x->cp > 1 && U == x->cp) { o += snprintf(out + o, n - o, " --cp-kind ulysses"); }
    else if (U > 1) { o += snprintf(out + o, n - o, " --cp-kind hybrid --cp-ulysses %d", U); }
    if (x->pp > 1) {
        o += snprintf(out + o, n - o, " --pp %d", x->pp);
        if (x->vpp > 1) { o += snprintf(out + o, n - o, " --vpp %d", x->vpp); }
        else { o += snprintf(out + o, n - o, " --pp-schedule %s", x->pp_schedule); }
        if (x->pp_layers) { o += snprintf(out + o, n - o, " --pp-layers %s", x->pp_layers); }
    }
    if (x->ep > 1) { o += snprintf(out + o, n - o, " --ep %d", x->ep); }
    o += snprintf(out + o, n - o, " --zero %d", x->zero);
    if (strcmp(x->recompute, "none")) { o += snprintf(out + o, n - o, " --recompute %s", x->recompute); }
    snprintf(out + o, n - o, " --ce-chunk %d", x->ce_chunk);
}

// A rule of layout_error, its numbers taken out: the key the refusals are counted by.
static void rule_of(const char *err, char *out, size_t n) {
    size_t o = 0;
    for (const char *c = err; *c && o + 2 < n; c++) {
        if (isdigit((unsigned char)*c)) {
            if (o == 0 || out[o - 1] != '#') { out[o++] = '#'; }
            while (isdigit((unsigned char)c[1]) || c[1] == '.') { c++; }
        } else {
            out[o++] = *c;
        }
    }
    out[o] = '\0';
}

typedef struct { char what[160]; long count; } Tally;
static void tally(Tally *t, int *n, int cap, const char *what) {
    for (int i = 0; i < *n; i++) { if (!strcmp(t[i].what, what)) { t[i].count++; return; } }
    if (*n < cap) { snprintf(t[*n].what, sizeof(t[*n].what), "%s", what); t[(*n)++].count = 1; }
}

// Whether the run of a is the run of a layout the search tries as well: --pp-layers auto giving the even
// split, or --ce-chunk 0 (the full logits) where the command line's chunk holds all the rank's tokens.
static int layout_same_as_another(const Layout *lay, const ModelConfig *c, int chunk) {
    if (lay->ce_chunk == 0 && chunk > 0 && lay->B * (lay->T / lay->cp) <= chunk) { return 1; }
    if (lay->pp_layers && !strcmp(lay->pp_layers, "auto")) {
        int even[PIPE_MAX_LAYERS + 1], aut[PIPE_MAX_LAYERS + 1];
        char err[256];
        if (layer_split(even, NULL, c, lay->T, lay->pp, lay->vpp, err, sizeof(err))
            || layer_split(aut, "auto", c, lay->T, lay->pp, lay->vpp, err, sizeof(err))) { return 0; }
        for (int s = 0; s <= lay->pp * lay->vpp; s++) { if (even[s] != aut[s]) { return 0; } }
        return 1;
    }
    return 0;
}

static int layout_same_choices(const Layout *x, const Layout *y) {
    return x->tp == y->tp && x->cp == y->cp && x->pp == y->pp && x->vpp == y->vpp && x->ep == y->ep
        && x->zero == y->zero && x->sp == y->sp && x->B == y->B && x->ce_chunk == y->ce_chunk
        && !strcmp(x->pp_schedule, y->pp_schedule) && !strcmp(x->recompute, y->recompute)
        && (x->pp_layers == NULL) == (y->pp_layers == NULL) && cp_ulysses_degree(x) == cp_ulysses_degree(y);
}

static int candidate_faster(const void *x, const void *y) {
    const Candidate *a = (const Candidate *)x, *b = (const Candidate *)y;
    if (a->t.total != b->t.total) { return a->t.total < b->t.total ? -1 : 1; }
    if (a->peak != b->peak) { return a->peak < b->peak ? -1 : 1; }
    return a->id < b->id ? -1 : a->id > b->id;
}

#define SEARCH_TOP 10

// The search's inputs and what it found so far.
typedef struct {
    Layout base;             // the command line's: -t, --attention, the CE chunk (the search tries 0 beside it)
    const ModelConfig *c;
    MoEOptions moe;
    int world;
    long tokens;             // -d
    PlanBuild b;
    Machine mc;
    double limit, reserve;   // --memory-limit (0: none); what the plan assumes beside the allocator (CUDA)
    Candidate *fit;          // the layouts that fit
    size_t nfit, cap;
    Tally invalid[64], over[MEM_NCAT];   // refusals by layout_error's rule; over the limit by largest category
    int ninvalid, nover;
    long tried, same;
    MemPlan *plans;          // (world) scratch: a layout's plans and shapes per stage
    CommShape *shapes;
} Search;

// One layout: refused by layout_error, the same run as another, over the limit, or planned and timed.
static void search_try(Search *s, Candidate x) {
    x.id = s->tried++;
    Layout a = x.lay;
    char err[512], rule[160];
    if (layout_error(&a, s->c, s->world, err, sizeof(err))) {
        rule_of(err, rule, sizeof(rule));
        tally(s->invalid, &s->ninvalid, 64, rule);
        return;
    }
    if (layout_same_as_another(&a, s->c, s->base.ce_chunk)) { s->same++; return; }
    int w = plan_stages(&a, s->c, s->moe, s->world, s->b, s->plans, s->shapes);
    x.peak = (double)s->plans[w].peak_total + s->reserve;
    if (s->limit > 0 && x.peak > s->limit) {
        int big = 0;
        for (int k = 1; k < MEM_NCAT; k++) { if (s->plans[w].peak[k] > s->plans[w].peak[big]) { big = k; } }
        tally(s->over, &s->nover, MEM_NCAT, mem_category_names[big]);
        return;
    }
    x.t = plan_step_time(&a, s->c, s->world, &s->mc, s->shapes);
    if (s->nfit == s->cap) { s->cap *= 2; s->fit = (Candidate *)realloc_check(s->fit, s->cap * sizeof(Candidate)); }
    s->fit[s->nfit++] = x;
}

// Every layout of one grid (tp x cp x pp, dp the rest): cp's attention (the ring, Ulysses, the hybrid at each U
// between), ep, ZeRO, SP, recompute, the pipeline's schedule (1F1B, GPipe, ZB-H1, interleaved with 2 chunks) and
// split (even, auto), the micro-batch B, the CE chunk (the command line's, and 0: the full logits).
static void search_grid_kind(Search *s, int tp, int cp, int pp, int u) {
    static const char *recomputes[3] = {"none", "mlp", "full"};
    static const char *schedules[4] = {"1f1b", "gpipe", "zb", "interleaved"};
    int dp = s->world / (tp * cp * pp), nsched = pp > 1 ? 4 : 1, nsplit = pp > 1 ? 2 : 1;
    int chunks[2] = {s->base.ce_chunk, 0}, nchunks = s->base.ce_chunk > 0 ? 2 : 1;
    for (int ep = 1; ep <= (s->c->num_experts > 0 ? dp : 1); ep++) {
        if (dp % ep) { continue; }
        for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); zero++) {
            for (int sp = 0; sp <= (tp > 1); sp++) {
                for (int r = 0; r < 3; r++) {
                    for (int sc = 0; sc < nsched; sc++) {
                        for (int split = 0; split < nsplit; split++) {
                            for (int B = 1; (long)B * s->base.T * dp <= s->tokens; B++) {
                                if (s->tokens % ((long)B * s->base.T * dp)) { continue; }
                                for (int k = 0; k < nchunks; k++) {
                                    Layout y = {B, s->base.T, (int)s->tokens, tp, sp, cp, u <= 1 ? "ring" : u == cp
                                                ? "ulysses" : "hybrid", u > 1 && u < cp ? u : 0, pp, sc == 3 ? 2 : 1,
                                                schedules[sc], split ? "auto" : NULL, -1, zero, ep, recomputes[r],
                                                chunks[k], s->base.attention};
                                    Candidate x = {y, 0, {0}, 0};
                                    search_try(s, x);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

static void search_grid(Search *s, int tp, int cp, int pp) {
    for (int u = 1; u <= cp; u++) { if (cp % u == 0) { search_grid_kind(s, tp, cp, pp, u); } }
}

// The search's heading: the model, the world, the limit, the machine's rates, the counts of the layouts tried.
static void search_heading(const Search *s) {
    const ModelConfig *c = s->c;
    const Machine *mc = &s->mc;
    long noverall = 0, ninv = 0;
    for (int i = 0; i < s->nover; i++) { noverall += s->over[i].count; }
    for (int i = 0; i < s->ninvalid; i++) { ninv += s->invalid[i].count; }
    char lim[32];
    snprintf(lim, sizeof(lim), s->limit > 0 ? "%.3g GiB" : "none", gib(s->limit));
    printf("layout search: L %d C %d NH %d Vp %d%s, %d ranks (nodes of %d), T %d, -d %ld tokens per step, %s; "
           "limit %s per rank%s\n", c->num_layers, c->channels, c->num_heads, c->padded_vocab_size,
           c->num_experts ? " (MoE)" : "", s->world, mc->gpus_per_node, s->base.T, s->tokens, s->b.name, lim,
           s->reserve > 0 ? " (1.00 GiB of it for the CUDA context and NCCL)" : "");
    printf("machine: %s: %.3g TFLOP/s GEMM, %.3g attention, %.3g GB/s memory, %.3g GB/s and %.3g us a call inside a "
           "node (all-to-all %.3g, %.3g; exchange %.3g, %.3g), %.3g and %.3g across, %.0f us per layer and micro-batch, collectives %.0f%% hidden beside compute%s\n",
           mc->name, mc->flops / 1e12, mc->attn_flops / 1e12, mc->mem_bw / 1e9, mc->node_bw / 1e9, mc->node_lat * 1e6,
           group_bw(mc, COMM_A2A, 1, 1) / 1e9, group_lat(mc, COMM_A2A, 1, 1) * 1e6, group_bw(mc, COMM_P2P, 1, 1) / 1e9,
           group_lat(mc, COMM_P2P, 1, 1) * 1e6, mc->net_bw / 1e9, mc->net_lat * 1e6, mc->layer_cost * 1e6,
           100 * mc->overlap, mc->cores > 0 ? ", ranks share the cores" : "");
    if (mc->given[0]) { printf("  (from the file: %s; the other keys the defaults')\n", mc->given); }
    printf("%ld layouts: %ld invalid, %ld the same as another, %ld over the limit, %zu fit\n", s->tried, ninv, s->same,
           noverall, s->nfit);
}

// The machine-readable lines of the shown layouts, for tests: "search rank peak seconds flags", then the bytes per
// step of each stage's first rank, by group: "search-comm rank stage exact tp cp pp dp ep edp emb" (exact 0: ZeRO-3's
// gathers with a pipeline or MoE layers are the bound, and MoE's counted dispatch assumes an even routing).
static void search_lines(Search *s, size_t shown) {
    for (size_t i = 0; i < shown; i++) {
        const Candidate *x = &s->fit[i];
        char flags[256], err[512];
        layout_flags(&x->lay, flags, sizeof(flags));
        printf("search %zu %.0f %.6f %s\n", i + 1, x->peak, x->t.total, flags);
        Layout a = x->lay;
        if (layout_error(&a, s->c, s->world, err, sizeof(err))) { fail("layout search: %s", err); }
        int accum = layout_accum(&a);
        plan_stages(&a, s->c, s->moe, s->world, s->b, s->plans, s->shapes);
        for (int st = 0; st < a.pp; st++) {
            const CommShape *sh = &s->shapes[st];
            CommBytes cb = comm_step_bytes(sh, accum, comm_ep_rows_even(sh, accum), NULL);
            int exact = !(sh->zero == 3 && !sh->z3_exact) && !(sh->nmoe > 0 && sh->ep > 1 && !sh->padded);
            printf("search-comm %zu %d %d %.0f %.0f %.0f %.0f %.0f %.0f %.0f\n", i + 1, st, exact, cb.tp, cb.cp, cb.pp,
                   cb.dp, cb.ep, cb.edp, cb.emb);
        }
    }
}

// The fastest layouts that fit (less those that only differ from a faster one shown in the CE chunk and take
// more memory: the model gives the chunk no time), then why the others are not shown.
static void search_report(Search *s) {
    const Machine *mc = &s->mc;
    qsort(s->fit, s->nfit, sizeof(Candidate), candidate_faster);
    search_heading(s);
    printf("%4s %10s %9s | %9s %8s %8s %8s %8s %8s %8s %8s | %s\n", "rank", "ms/step", "peak GiB", "compute",
           "bubble", "tp", "cp", "ep", "pp", "dp", "adamw", "flags (with -e, -t, -d as given)");
    size_t shown = 0, dominated = 0;
    for (size_t i = 0; i < s->nfit && shown < SEARCH_TOP; i++) {
        int dom = 0;
        for (size_t j = 0; j < shown && !dom; j++) {
            Layout y = s->fit[j].lay;
            y.ce_chunk = s->fit[i].lay.ce_chunk;
            dom = layout_same_choices(&y, &s->fit[i].lay) && s->fit[j].peak <= s->fit[i].peak;
        }
        if (dom) { dominated++; continue; }
        s->fit[shown++] = s->fit[i];
    }
    for (size_t i = 0; i < shown; i++) {
        const Candidate *x = &s->fit[i];
        const Layout *y = &x->lay;
        char flags[256];
        layout_flags(y, flags, sizeof(flags));
        printf("%4zu %10.2f %9.3f | %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | %s\n", i + 1, x->t.total * 1e3,
               gib(x->peak), x->t.compute * 1e3, x->t.bubble * 1e3, x->t.tp * 1e3, x->t.cp * 1e3, x->t.ep * 1e3,
               x->t.pp * 1e3, x->t.dp * 1e3, x->t.optimizer * 1e3, flags);
        int G = mc->gpus_per_node, tp_spans = y->tp > G, ep_spans = y->ep > 1 && (long)y->tp * y->cp * y->pp * y->ep > G;
        if (tp_spans || ep_spans) {
            printf("     warning: its %s group spans nodes of %d ranks: it runs at the network's bandwidth\n",
                   tp_spans ? "tp" : "ep", G);
        }
    }
    search_lines(s, shown);
    if (s->nfit > shown) {
        printf("not shown: %zu that fit: %zu slower, %zu only another CE chunk of one shown, as fast and larger\n",
               s->nfit - shown, s->nfit - shown - dominated, dominated);
    }
    if (s->same) {
        printf("not planned: %ld the same run as another (--pp-layers auto giving the even split, or --ce-chunk 0 where "
               "the chunk holds every token)\n", s->same);
    }
    for (int i = 0; i < s->nover; i++) {
        printf("over the limit: %ld, its largest category %s\n", s->over[i].count, s->over[i].what);
    }
    for (int i = 0; i < s->ninvalid; i++) { printf("invalid: %ld: %s\n", s->invalid[i].count, s->invalid[i].what); }
}

// --plan-search N: every grid of N ranks (tp x cp x pp x dp), each grid's layouts, then the report.
// base: the command line's layout; memory_limit: --memory-limit (0: none).
static void plan_search(const Layout *base, const ModelConfig *c, MoEOptions moe, int world, PlanBuild b, Machine mc,
                        double memory_limit) {
    Search s;
    memset(&s, 0, sizeof(s));
    s.base = *base; s.c = c; s.moe = moe; s.world = world;
    s.tokens = base->total_batch > 0 ? base->total_batch : (long)base->B * base->T * world;
    s.b = b;
    s.mc = mc;
    s.limit = memory_limit > 0 ? memory_limit : 0;
    s.reserve = plan_reserve(s.b);
    s.cap = 1024;
    s.fit = (Candidate *)malloc_check(s.cap * sizeof(Candidate));
    s.plans = (MemPlan *)malloc_check(world * sizeof(MemPlan));
    s.shapes = (CommShape *)malloc_check(world * sizeof(CommShape));
    double t0 = monotonic_seconds();
    for (int tp = 1; tp <= world; tp++) {
        for (int cp = 1; cp <= world / tp; cp++) {
            for (int pp = 1; pp <= world / (tp * cp); pp++) {
                if (world % (tp * cp * pp) == 0) { search_grid(&s, tp, cp, pp); }
            }
        }
    }
    double seconds = monotonic_seconds() - t0;
    search_report(&s);
    printf("(searched in %.2f s)\n", seconds);
    fflush(stdout);
    free(s.fit); free(s.plans); free(s.shapes);
}

#endif // LLMC_LAYOUT_SEARCH_H
