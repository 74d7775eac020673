// Learning-rate schedules, as llm.c: linear warm-up over `warmup` steps to lr, then
//   cosine:   lr_min + 0.5 (1 + cos(pi * progress)) (lr - lr_min)
//   linear:   lr - progress (lr - lr_min)
//   constant: lr
//   wsd:      warm-up, stable at lr, then linear decay to lr_min over the last 20% of the steps
// with lr_min = final_frac * lr and progress = (step - warmup) / (total - warmup).
#ifndef LLMC_SCHEDULERS_H
#define LLMC_SCHEDULERS_H

#include <string.h>
#include <math.h>

typedef struct {
    const char *type;
    float lr, final_frac;
    int warmup, total;
} LRScheduler;

static int lr_scheduler_valid(const char *type) {
    return !strcmp(type, "cosine") || !strcmp(type, "linear") || !strcmp(type, "constant") || !strcmp(type, "wsd");
}

static float lr_at(const LRScheduler *s, int step) {
    float lr = s->lr, lr_min = s->lr * s->final_frac;
    if (!strcmp(s->type, "constant")) { return step < s->warmup ? lr * (step + 1) / s->warmup : lr; }
    if (step < s->warmup) { return lr * (step + 1) / s->warmup; }
    if (!strcmp(s->type, "wsd")) {
        int decay_start = (int)(0.8f * s->total);
        if (decay_start < s->warmup) { decay_start = s->warmup; }
        if (step < decay_start) { return lr; }
        float p = s->total > decay_start ? (float)(step - decay_start) / (s->total - decay_start) : 1.0f;
        return lr - p * (lr - lr_min);
    }
    float progress = s->total > s->warmup ? (float)(step - s->warmup) / (s->total - s->warmup) : 1.0f;
    if (!strcmp(s->type, "linear")) { return lr - progress * (lr - lr_min); }
    return lr_min + 0.5f * (1.0f + cosf(3.14159265358979f * progress)) * (lr - lr_min);
}

#endif
