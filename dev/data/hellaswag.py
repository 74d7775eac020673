"""
HellaSwag's examples (a jsonl file of {"ctx", "endings" (4), "label"} objects, as github.com/rowanz/hellaswag
publishes them) into llm.c's eval file, for train_gpt --hellaswag:

    .venv/bin/python dev/data/hellaswag.py [--input FILE] [--out FILE] [--split val] [--tokenizer DIR]

Without --input the split's jsonl is downloaded into dev/data/hellaswag/ (when the network allows; else say so and
stop). Default out: dev/data/hellaswag/hellaswag_SPLIT.bin.

The file (llm.c's write_evalfile): int32 header[256] = {20240522, version, examples, the longest example in bytes},
then per example one stream of fields:
    <DELIMITER> <EXAMPLE_BYTES> <INDEX> <LABEL> <COMPLETIONS = 4>
    <CONTEXT_LENGTH> context tokens   then per completion: <LENGTH> completion tokens
EXAMPLE_BYTES counts the whole stream, the delimiter included; INDEX is the example's place in the input (from 0).
Version 1 (llm.c's): every field uint16, the delimiter 65535, every token below it. Version 2 (this project's, for
vocabularies past 65,535 ids; llm.c reads only version 1): every field uint32, the delimiter 0xFFFFFFFF; written
only when some token needs it. The context is the tokens of ctx, each completion the tokens of " " + ending (GPT-2's
BPE by default); with --tokenizer DIR (a Hugging Face tokenizer, as tinyshakespeare.py takes it) the context starts
with its BOS (its EOS if it has none), as our shards start each document.

Bad input (an empty file, a line that is not a JSON object, a label out of range, not 4 endings, an example too long
for version 1's 16-bit byte count) is one line "error: ..." and nothing written; the file is written to OUT.tmp and
renamed.
"""
import argparse
import json
import os
import struct
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cli import fail  # noqa: E402
from tinyshakespeare import make_tokenizer  # noqa: E402

MAGIC = 20240522
URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{}.jsonl"
ENDINGS = 4


def download(split, d):
    path = os.path.join(d, f"hellaswag_{split}.jsonl")
    if os.path.exists(path):
        return path
    os.makedirs(d, exist_ok=True)
    try:
        with urllib.request.urlopen(URL.format(split), timeout=30) as r:
            data = r.read()
    except OSError as e:
        fail(f"cannot download HellaSwag's {split} split ({e}): give the jsonl file with --input FILE")
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def read_examples(path):
    """[(ctx, endings, label)] of a jsonl file, each line checked"""
    out = []
    try:
        lines = open(path, "rb").read().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--input {path}: {getattr(e, 'strerror', None) or e}")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
        except ValueError as e:
            fail(f"{path}:{i}: not valid JSON ({str(e)[:80]})")
        if not isinstance(ex, dict) or not isinstance(ex.get("ctx"), str):
            fail(f"{path}:{i}: expected an object with a string 'ctx'")
        endings, label = ex.get("endings"), ex.get("label")
        if not isinstance(endings, list) or len(endings) != ENDINGS or not all(isinstance(e, str) for e in endings):
            fail(f"{path}:{i}: expected 'endings' to be a list of {ENDINGS} strings")
        if type(label) is str and label.isdigit():   # (some copies store it as a string)
            label = int(label)
        if type(label) is not int or not 0 <= label < ENDINGS:
            fail(f"{path}:{i}: 'label' = {json.dumps(label)[:40]}: expected 0 to {ENDINGS - 1}")
        out.append((ex["ctx"], endings, label))
    if not out:
        fail(f"{path}: no examples in it")
    return out


def example_stream(index, label, ctx, completions):
    """the fields of one example, EXAMPLE_BYTES left 0 (delimiter_bytes fills it)"""
    s = [None, 0, index, label, len(completions), len(ctx), *ctx]
    for c in completions:
        s += [len(c), *c]
    return s


def encode_examples(examples, tok, bos):
    out = []
    for ctx, endings, label in examples:
        c = ([bos] if bos is not None else []) + tok.encode(ctx)
        out.append((label, c, [tok.encode(" " + e) for e in endings]))
    return out


def write_evalfile(path, encoded):
    """llm.c's eval file (version 1, or 2 when a token is 65535 or more); returns (version, longest bytes)"""
    top = max(max([*c, *(t for e in es for t in e)], default=0) for _, c, es in encoded)
    version, width, delim = (1, 2, 0xFFFF) if top < 0xFFFF else (2, 4, 0xFFFFFFFF)
    fmt = "<H" if width == 2 else "<I"
    body, longest = [], 0
    for index, (label, ctx, ends) in enumerate(encoded):
        s = example_stream(index, label, ctx, ends)
        s[0] = delim
        s[1] = nbytes = len(s) * width
        if nbytes >= 1 << (8 * width) or index >= delim:
            fail(f"example {index}: {nbytes} bytes, more than version {version}'s fields can count")
        longest = max(longest, nbytes)
        body.append(struct.pack(f"<{len(s)}{fmt[1]}", *s))
    header = [MAGIC, version, len(encoded), longest] + [0] * 252
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(b"".join(body))
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        fail(f"cannot write {path}: {e.strerror}")
    return version, longest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", help="a HellaSwag jsonl file (default: the split, downloaded)")
    ap.add_argument("--out", help="the eval file (default dev/data/hellaswag/hellaswag_SPLIT.bin)")
    ap.add_argument("--split", default="val", choices=("train", "val", "test"))
    ap.add_argument("--tokenizer", default="gpt2", metavar="gpt2|DIR", help="GPT-2's BPE, or a Hugging Face tokenizer")
    a = ap.parse_args()
    d = os.path.join(HERE, "hellaswag")
    examples = read_examples(a.input or download(a.split, d))
    tok = make_tokenizer(a.tokenizer)   # (GPT-2's BPE, or the directory's)
    bos = tok.eot if tok.name == "hf" else None   # (its BOS, else its EOS)
    out = a.out or os.path.join(d, f"hellaswag_{a.split}.bin")
    version, longest = write_evalfile(out, encode_examples(examples, tok, bos))
    print(f"wrote {len(examples)} examples to {out} (version {version}{', uint32 fields: llm.c reads only version 1' if version == 2 else ''}; "
          f"the longest {longest} bytes)")


if __name__ == "__main__":
    main()
