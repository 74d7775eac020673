"""
Sample text from a model trained here: the prompt is encoded with the same tokenizer the data script used
(GPT-2's BPE through tiktoken, offline, for a V 50257 model; bytes for a V 257 one), train_gpt generates
after those token ids (-x 0: no training step, only the end of a run's work: the sample), and the ids it
prints are decoded back to text.

    .venv/bin/python dev/sample.py "First Citizen:" -e out/tinyshakespeare/model_00000300.bin
    .venv/bin/python dev/sample.py "ROMEO:" -e MODEL -g 200 -t 256 --sample-temperature 0.8 --sample-top-k 40
    .venv/bin/python dev/sample.py "ROMEO:" -e MODEL --np 2 --tp 2      (any layout: mpirun -np 2 ...)
    .venv/bin/python dev/sample.py -e MODEL -- "-x marks the spot"      (a prompt that starts with -; or --prompt=TEXT)

A model of another vocabulary (an imported Llama, Qwen2, ...) takes its Hugging Face tokenizer: --tokenizer DIR
(a directory with tokenizer.json and tokenizer_config.json, as the hub's or save_pretrained's), loaded offline by
transformers' AutoTokenizer; the prompt is encoded as the tokenizer does by default (a BOS first where it adds
one), the text decoded without the special tokens:
    .venv/bin/python dev/sample.py "Once upon a time" -e smol.bin --tokenizer hf/smol -g 32

Other flags go to train_gpt as they are (give the prompt first: a flag's value before it is taken for it),
except those this script gives it itself (-e, -x, -v, -s, -g, --prompt-ids). Prints the prompt and the text
generated after it. Bad input (a prompt that is not UTF-8, an unreadable -e) is one line "error: ...".
"""
import argparse
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "data"))
from tinyshakespeare import make_tokenizer  # noqa: E402  (the data script's tokenizers)
from cli import check_tokenizer_dir, fail, Parser  # noqa: E402

OURS = ("-e", "-x", "-v", "-s", "-g", "--prompt-ids")   # the flags this script gives train_gpt


def model_vocab(path):
    """V from an llm.c model file's header (int32 [3])"""
    try:
        with open(path, "rb") as f:
            raw = f.read(32)
    except OSError as e:
        fail(f"-e {path}: {e.strerror}")
    if len(raw) < 32:
        fail(f"-e {path}: {len(raw)} bytes, not a model file (its header is 1024)")
    h = struct.unpack("<8i", raw)
    if h[0] != 20240326:
        fail(f"-e {path} is not a model file (magic {h[0]}, expected 20240326)")
    return h[3]


def hf_tokenizer(d, V):
    """(encode, decode) of the Hugging Face tokenizer in directory d (AutoTokenizer, offline), for a model of V ids"""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        fail("--tokenizer needs transformers (scripts/setup.sh installs it into .venv)")
    transformers.logging.set_verbosity_error()
    check_tokenizer_dir(d)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)
    except Exception as e:   # no tokenizer files, a broken one: whatever transformers raises
        why = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        fail(f"--tokenizer {d}: AutoTokenizer cannot load it (tokenizer.json, tokenizer_config.json?): {why[:160]}")

    def encode(text):
        ids = tok(text)["input_ids"]
        big = [i for i in ids if i >= V]
        if big:
            fail(f"--tokenizer {d} encodes the prompt to id {big[0]}, past the model's vocabulary ({V} ids)")
        return ids
    return encode, lambda ids: tok.decode(ids, skip_special_tokens=True)


def main():
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("prompt", nargs="?", help="the text to continue (one that starts with '-': after --)")
    ap.add_argument("--prompt", dest="prompt_flag", metavar="TEXT", help="the text to continue (--prompt=TEXT)")
    ap.add_argument("-e", required=True, help="the model file (train_gpt's -e)")
    ap.add_argument("-g", type=int, default=64, help="tokens to generate (64)")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "train_gpt"), help="the train_gpt binary")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun -np N; 1: no mpirun)")
    ap.add_argument("--tokenizer", metavar="DIR", help="a Hugging Face tokenizer directory (AutoTokenizer, offline) "
                    "for a model of another vocabulary than GPT-2's or bytes'")
    a, rest = ap.parse_known_args()
    for f in rest:
        if f in OURS:   # e.g. a prompt "-x" given as it is
            fail(f"{f} is given to train_gpt by dev/sample.py itself; a prompt that starts with '-' goes after -- "
                 "or as --prompt=TEXT")
    if (a.prompt is None) == (a.prompt_flag is None):
        fail("expected one prompt: TEXT, -- TEXT or --prompt=TEXT")
    prompt = a.prompt if a.prompt is not None else a.prompt_flag
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:   # bytes that are not UTF-8 reach Python as lone surrogates
        fail(f"the prompt is not valid UTF-8 (byte {ord(prompt[e.start]) & 0xFF:#04x} at character {e.start})")
    V = model_vocab(a.e)
    if a.tokenizer is not None:
        encode, decode = hf_tokenizer(a.tokenizer, V)
    elif V in (50257, 257):
        tok = make_tokenizer("gpt2" if V == 50257 else "byte")
        encode = tok.encode
        decode = lambda ids: b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
    else:
        fail(f"{a.e} has a vocabulary of {V}: dev/sample.py knows GPT-2's (50257) and bytes (257); give its "
             "tokenizer with --tokenizer DIR")
    ids = encode(prompt)
    cmd = [a.bin, "-e", a.e, "-x", "0", "-v", "0", "-s", "0", "-g", str(a.g),
           "--prompt-ids", ",".join(str(i) for i in ids)] + rest
    if a.np > 1:
        cmd = ["mpirun", "-np", str(a.np), "--oversubscribe", "-x", "OMP_NUM_THREADS=1"] + cmd
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        fail(f"cannot run {cmd[0]}: {e.strerror}")
    lines = [l for l in out.stdout.splitlines() if l.startswith("sample ids:")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stdout[-2000:] + out.stderr[-2000:])
        fail(f"train_gpt exited {out.returncode} without a sample: {' '.join(cmd[:8])} ...")
    gen = [int(x) for x in lines[-1].split(":", 1)[1].split()]
    print(decode(ids + gen))


if __name__ == "__main__":
    main()
