// Sampling the next token from the logits of the last position (as llm.c's sampler.h): the most likely token at
// temperature 0, else a draw from the softmax at the temperature over the top-k tokens (all: 0). The forward over the
// text's window and the logits of its last position are the model's.
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H

#include "utils.h"
#include "alloc.h"

// What sampling needs, allocated once (a call allocates nothing: on CUDA an allocation waits for the device).
typedef struct {
    int *window;          // (B, T*cp) the tokens a forward sees: the text's last T*cp tokens, then EOT
    int *text;            // the prompt and the tokens generated (cap of them)
    int cap;
    floatX *row;          // (Vp) the logits of one position (the last stage)
    float *logits;        // (Vp) on the host
    int *order;           // (V) top-k: the tokens by logit
    float temperature;    // 0: the most likely token
    int top_k;            // 0: every token
} Sampler;

// window: the tokens of a forward (B T cp); the logits row on the last pipeline stage only (the memory plan counts it).
static void sampler_init(Sampler *s, size_t window, int cap, int Vp, int last, float temperature, int top_k) {
    s->window = (int *)malloc_check(sizeof(int) * window);
    s->text = (int *)malloc_check(sizeof(int) * cap);
    s->cap = cap;
    s->row = last ? (floatX *)mem_alloc((size_t)Vp * floatx_bytes(), MEM_LOGITS) : NULL;
    s->logits = (float *)malloc_check(sizeof(float) * Vp);
    s->order = (int *)malloc_check(sizeof(int) * Vp);
    s->temperature = temperature;
    s->top_k = top_k;
}

static const float *sort_logits;   // (sort_desc's key: qsort has no context)
static int sort_desc(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    float la = sort_logits[a], lb = sort_logits[b];
    return la > lb ? -1 : la < lb ? 1 : a - b;   // ties: the lower token first
}

// The next token from logits (V) and a coin in [0, 1): temperature 0, the most likely (the lower token on a
// tie); else p_v = exp((logit_v - max) / temperature) over the top_k most likely (all: 0), renormalised,
// and the first token whose cumulative p exceeds the coin.
static int sample_token(Sampler *s, const float *logits, int V, float coin01) {
    int n = V;
    for (int v = 0; v < V; v++) { s->order[v] = v; }
    if (s->temperature == 0.0f || (s->top_k > 0 && s->top_k < V)) {
        sort_logits = logits;
        qsort(s->order, V, sizeof(int), sort_desc);
        if (s->temperature == 0.0f) { return s->order[0]; }
        n = s->top_k;
    }
    float maxv = -INFINITY;
    for (int i = 0; i < n; i++) { if (logits[s->order[i]] > maxv) { maxv = logits[s->order[i]]; } }
    double sum = 0.0, cdf = 0.0;
    for (int i = 0; i < n; i++) { sum += exp((logits[s->order[i]] - maxv) / s->temperature); }
    double coin = coin01 * sum;
    for (int i = 0; i < n; i++) {
        cdf += exp((logits[s->order[i]] - maxv) / s->temperature);
        if (coin < cdf) { return s->order[i]; }
    }
    return s->order[n - 1];
}

// The prompt's tokens: --prompt-ids (0 <= id < V), or --prompt's bytes (a byte model: V 257); *n of them.
static int *sampler_prompt(const char *prompt, const char *prompt_ids, int V, int rank, int *n) {
    int *ids = (int *)malloc_check(sizeof(int) * (strlen(prompt_ids ? prompt_ids : prompt ? prompt : "") + 1));
    *n = 0;
    if (prompt) {
        if (V != 257) {
            fail_all(rank, "--prompt TEXT needs a byte model (V 257), this one has V %d: give --prompt-ids, or encode the "
                     "text with dev/sample.py", V);
        }
        for (const char *c = prompt; *c; c++) { ids[(*n)++] = (unsigned char)*c; }
    }
    for (const char *c = prompt_ids; c && *c;) {
        char *end;
        long id = strtol(c, &end, 10);
        if (end == c || (*end != ',' && *end != '\0') || id < 0 || id >= V) {
            fail_all(rank, "--prompt-ids '%s': expected token ids 0..%d separated by commas", prompt_ids, V - 1);
        }
        ids[(*n)++] = (int)id;
        c = *end ? end + 1 : end;
    }
    return ids;
}

#endif // LLMC_SAMPLER_H
