/*
Tokenizer: maps token ids back to their byte strings, for printing samples.
Decoding only; encoding is done offline by the python scripts in dev/data.

File format (little-endian):
  int32 header[256]: [0] magic 20240328, [1] version (1 or 2),
                     [2] vocab size, [3] EOT token id (version 2 only)
  then for each token id 0..vocab_size-1:
    uint8 length (>= 1), followed by that many bytes

Plain C that is also valid C++ (it is compiled by g++ and nvcc).
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <ctype.h>
#include <unistd.h>
#include "utils.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_MAX_VOCAB (1u << 24) // sanity bound against garbage headers

typedef struct {
    uint32_t vocab_size;
    int eot_token;
    char **token_table; // token_table[id] is a NUL-terminated copy of the token's bytes
    int init_ok;
} Tokenizer;

// ----------------------------------------------------------------------------
// internal helpers

// reads a little-endian int32, independent of host byte order
static inline int32_t tokenizer_le32_(const unsigned char *p) {
    uint32_t v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    return (int32_t)v;
}

// version 1 files carry no EOT id: GPT-2 uses 50256, otherwise assume the last id
static inline int tokenizer_default_eot_(uint32_t vocab_size) {
    return vocab_size == 50257 ? 50256 : (int)vocab_size - 1;
}

// frees whatever part of the table was loaded; leaves t in the "not loaded" state
static inline void tokenizer_release_(Tokenizer *t) {
    if (t->token_table != NULL) {
        for (uint32_t i = 0; i < t->vocab_size; i++) {
            free(t->token_table[i]); // entries not yet loaded are NULL (calloc)
        }
        free(t->token_table);
    }
    t->token_table = NULL;
    t->vocab_size = 0;
    t->eot_token = -1;
    t->init_ok = 0;
}

// common exit for a malformed file: clean up and report -2
static inline int tokenizer_fail_(Tokenizer *t, FILE *file) {
    tokenizer_release_(t);
    fclose(file);
    return -2;
}

// checks the header and fills vocab_size / eot_token; returns 0 or -2 after printing an error
static inline int tokenizer_parse_header_(Tokenizer *t, FILE *file, const char *filename) {
    unsigned char raw[TOKENIZER_HEADER_INTS * 4];
    if (fread(raw, 1, sizeof(raw), file) != sizeof(raw)) {
        fprintf(stderr, "warning: tokenizer %s is truncated: expected a %d-byte header\n",
                filename, (int)sizeof(raw));
        return -2;
    }
    int32_t magic = tokenizer_le32_(raw + 0);
    int32_t version = tokenizer_le32_(raw + 4);
    int32_t vocab = tokenizer_le32_(raw + 8);
    if (magic != TOKENIZER_MAGIC) {
        fprintf(stderr, "warning: tokenizer %s has bad magic %d, expected %d\n",
                filename, (int)magic, TOKENIZER_MAGIC);
        return -2;
    }
    if (version != 1 && version != 2) {
        fprintf(stderr, "warning: tokenizer %s has version %d, expected 1 or 2\n", filename, (int)version);
        return -2;
    }
    if (vocab <= 0 || (uint32_t)vocab > TOKENIZER_MAX_VOCAB) {
        fprintf(stderr, "warning: tokenizer %s has vocab size %d, expected 1..%u\n",
                filename, (int)vocab, TOKENIZER_MAX_VOCAB);
        return -2;
    }
    int32_t eot = (version == 1) ? tokenizer_default_eot_((uint32_t)vocab) : tokenizer_le32_(raw + 12);
    if (eot < 0 || eot >= vocab) {
        fprintf(stderr, "warning: tokenizer %s has EOT id %d, expected 0..%d\n", filename, (int)eot, (int)vocab - 1);
        return -2;
    }
    t->vocab_size = (uint32_t)vocab;
    t->eot_token = (int)eot;
    return 0;
}

// reads vocab_size (length, bytes) records into token_table; returns 0 or -2 after printing an error
static inline int tokenizer_read_table_(Tokenizer *t, FILE *file, const char *filename) {
    t->token_table = (char **)calloc(t->vocab_size, sizeof(char *));
    if (t->token_table == NULL) {
        fprintf(stderr, "warning: tokenizer %s: out of memory for %u tokens\n", filename, t->vocab_size);
        return -2;
    }
    for (uint32_t i = 0; i < t->vocab_size; i++) {
        unsigned char length;
        if (fread(&length, 1, 1, file) != 1) {
            fprintf(stderr, "warning: tokenizer %s is truncated: expected %u tokens, got %u\n",
                    filename, t->vocab_size, i);
            return -2;
        }
        if (length == 0) {
            fprintf(stderr, "warning: tokenizer %s: token %u has length 0, expected 1..255\n", filename, i);
            return -2;
        }
        char *piece = (char *)malloc((size_t)length + 1);
        if (piece == NULL) {
            fprintf(stderr, "warning: tokenizer %s: out of memory at token %u\n", filename, i);
            return -2;
        }
        t->token_table[i] = piece; // owned by the table from here on, even if the read fails
        if (fread(piece, 1, length, file) != length) {
            fprintf(stderr, "warning: tokenizer %s is truncated inside token %u (expected %u bytes)\n",
                    filename, i, (unsigned)length);
            return -2;
        }
        piece[length] = '\0';
    }
    return 0;
}

// ----------------------------------------------------------------------------
// public API

// loads a tokenizer file. returns 0 on success;
// -1 if the file cannot be opened (warning only: callers fall back to printing token ids);
// -2 if the file is malformed (error printed). on failure init_ok is 0 and nothing is allocated.
static inline int tokenizer_init(Tokenizer *t, const char *filename) {
    t->vocab_size = 0;
    t->eot_token = -1;
    t->token_table = NULL;
    t->init_ok = 0;
    FILE *file = fopen(filename, "rb");
    if (file == NULL) {
        fprintf(stderr, "warning: cannot open tokenizer file %s; samples are printed as token ids\n", filename);
        return -1;
    }
    if (tokenizer_parse_header_(t, file, filename) != 0) { return tokenizer_fail_(t, file); }
    if (tokenizer_read_table_(t, file, filename) != 0) { return tokenizer_fail_(t, file); }
    fclose(file);
    t->init_ok = 1;
    return 0;
}

// returns the NUL-terminated bytes of token_id, or NULL if not loaded or out of range
static inline const char *tokenizer_decode(Tokenizer *t, uint32_t token_id) {
    if (t == NULL || !t->init_ok || token_id >= t->vocab_size) { return NULL; }
    return t->token_table[token_id];
}

// frees the table; safe to call after any tokenizer_init result, and twice
static inline void tokenizer_free(Tokenizer *t) {
    if (t == NULL) { return; }
    tokenizer_release_(t);
}

// prints a decoded piece, skipping lone non-printable bytes (raw byte tokens, control codes)
static inline void safe_printf(const char *piece) {
    if (piece == NULL || piece[0] == '\0') { return; }
    if (piece[1] == '\0') {
        unsigned char byte = (unsigned char)piece[0];
        if (!(isprint(byte) || isspace(byte))) { return; }
    }
    printf("%s", piece);
}

// The tokenizer.bin beside a data shard (the one llm.c's data scripts write), if there is one and it has
// the model's vocabulary: its table would print other tokens otherwise (warned by say). Else nothing
// (samples are printed as token ids).
static void tokenizer_init_beside(Tokenizer *tok, const char *shard, int vocab, int say) {
    char tok_path[PATH_LEN];
    memset(tok, 0, sizeof(*tok));
    if (snprintf(tok_path, sizeof(tok_path), "%s", shard) >= (int)sizeof(tok_path)) { tok_path[0] = '\0'; }
    char *slash = strrchr(tok_path, '/');
    snprintf(slash ? slash + 1 : tok_path, sizeof(tok_path) - (slash ? slash + 1 - tok_path : 0), "tokenizer.bin");
    if (access(tok_path, R_OK) == 0) { tokenizer_init(tok, tok_path); }
    if (tok->init_ok && (int)tok->vocab_size != vocab) {
        if (say) {
            printf("warning: %s has %u tokens, the model %d: samples are printed as token ids\n", tok_path,
                   tok->vocab_size, vocab);
        }
        tokenizer_free(tok);
        memset(tok, 0, sizeof(*tok));
    }
}

#endif // LLMC_TOKENIZER_H
