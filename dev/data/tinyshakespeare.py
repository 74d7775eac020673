"""
Tokenize a local tinyshakespeare text file into llm.c-style shards.

Writes into --out:
  tiny_shakespeare_val.bin    first --val-tokens tokens
  tiny_shakespeare_train.bin  remaining tokens
  tokenizer.bin               token id -> bytes table (for decoding samples)

Shard format: int32 header[256] (magic 20240520, version 1, token count),
then the tokens as little-endian uint16.
Tokenizer format: int32 header[256] (magic 20240328, version 2, vocab size,
EOT id), then per token id: uint8 length + that many bytes.

Tokenizers:
  gpt2  tiktoken GPT-2 BPE (needs tiktoken and its cached BPE files)
  byte  ids 0..255 are raw bytes, 256 is <|endoftext|>, vocab 257
  auto  try gpt2, fall back to byte on any failure (default)

Stdlib only; numpy is used when available but not required.

Example:
  python3 dev/data/tinyshakespeare.py --input ../shared/data/tinyshakespeare.txt \
      --out dev/data/tinyshakespeare
"""

import argparse
import os
import struct
import sys
from array import array

try:
    import numpy as np
except ImportError:
    np = None

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2
HEADER_INTS = 256
EOT_TEXT = b"<|endoftext|>"


# -----------------------------------------------------------------------------
# tokenizers: each exposes name, vocab_size, eot, encode(str)->list[int],
# token_bytes(id)->bytes

class ByteTokenizer:
    """Raw UTF-8 bytes as tokens 0..255, plus EOT = 256."""
    name = "byte"
    vocab_size = 257
    eot = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id):
        if token_id == self.eot:
            return EOT_TEXT
        return bytes([token_id])


class GPT2Tokenizer:
    """GPT-2 BPE via tiktoken."""
    name = "gpt2"

    def __init__(self):
        import tiktoken
        self.enc = tiktoken.get_encoding("gpt2")
        self.vocab_size = self.enc.n_vocab
        self.eot = self.enc.eot_token
        self.enc.encode_ordinary("hello world")  # fail early if BPE data is unusable

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def token_bytes(self, token_id):
        if token_id == self.eot:
            return EOT_TEXT
        return self.enc.decode_single_token_bytes(token_id)


def make_tokenizer(kind):
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        try:
            return GPT2Tokenizer()
        except Exception as e:
            sys.exit(f"gpt2 tokenizer unavailable ({type(e).__name__}: {e}); try --tokenizer byte")
    # auto: prefer gpt2, fall back to bytes
    try:
        return GPT2Tokenizer()
    except Exception as e:
        print(f"gpt2 tokenizer unavailable ({type(e).__name__}: {e}); falling back to byte")
        return ByteTokenizer()


# -----------------------------------------------------------------------------
# tokenization

def tokenize_documents(text, tok):
    """Split on blank lines, prepend EOT to each document, keep the separator."""
    docs = text.split("\n\n")
    tokens = []
    for i, doc in enumerate(docs):
        if i != len(docs) - 1:
            doc = doc + "\n\n"  # restore the separator we split on
        tokens.append(tok.eot)
        tokens.extend(tok.encode(doc))
    return tokens


# -----------------------------------------------------------------------------
# writers

def header_bytes(values):
    """int32 little-endian header of HEADER_INTS entries, zero-padded."""
    assert len(values) <= HEADER_INTS
    padded = list(values) + [0] * (HEADER_INTS - len(values))
    return struct.pack("<%di" % HEADER_INTS, *padded)


def uint16_le_bytes(tokens):
    """Tokens as little-endian uint16 bytes (numpy if present, else array)."""
    assert all(0 <= t < 2**16 for t in tokens), "token id does not fit in uint16"
    if np is not None:
        return np.asarray(tokens, dtype="<u2").tobytes()
    a = array("H", tokens)
    assert a.itemsize == 2
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def write_shard(path, tokens):
    with open(path, "wb") as f:
        f.write(header_bytes([SHARD_MAGIC, SHARD_VERSION, len(tokens)]))
        f.write(uint16_le_bytes(tokens))


def write_tokenizer(path, tok):
    with open(path, "wb") as f:
        f.write(header_bytes([TOKENIZER_MAGIC, TOKENIZER_VERSION, tok.vocab_size, tok.eot]))
        for i in range(tok.vocab_size):
            b = tok.token_bytes(i)
            assert 1 <= len(b) <= 255, f"token {i} has byte length {len(b)}"
            f.write(struct.pack("<B", len(b)))
            f.write(b)


# -----------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description="tokenize tinyshakespeare into llm.c shards")
    parser.add_argument("--input", required=True, help="path to the input text file")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--tokenizer", choices=["auto", "gpt2", "byte"], default="auto")
    parser.add_argument("--val-tokens", type=int, default=32768,
                        help="number of leading tokens that go to the val shard")
    args = parser.parse_args()

    with open(args.input, "r", encoding="utf-8") as f:
        text = f.read()

    tok = make_tokenizer(args.tokenizer)
    print(f"tokenizer: {tok.name}, vocab size {tok.vocab_size}, eot {tok.eot}")

    tokens = tokenize_documents(text, tok)
    if args.val_tokens < 0 or args.val_tokens >= len(tokens):
        sys.exit(f"--val-tokens {args.val_tokens} must be in [0, {len(tokens)})")
    val, train = tokens[:args.val_tokens], tokens[args.val_tokens:]

    os.makedirs(args.out, exist_ok=True)
    val_path = os.path.join(args.out, "tiny_shakespeare_val.bin")
    train_path = os.path.join(args.out, "tiny_shakespeare_train.bin")
    tok_path = os.path.join(args.out, "tokenizer.bin")
    write_shard(val_path, val)
    write_shard(train_path, train)
    write_tokenizer(tok_path, tok)

    print(f"wrote {len(val):,} tokens to {val_path}")
    print(f"wrote {len(train):,} tokens to {train_path}")
    print(f"wrote {tok.vocab_size} token entries to {tok_path}")


if __name__ == "__main__":
    main()
