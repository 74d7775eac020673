"""
FineWeb or FineWeb-Edu into llm.c's token shards, for the GPT-2 recipe (scripts/run_gpt2_124M.sh):

    .venv/bin/python dev/data/fineweb.py [--input DIR] [--out DIR] [--version 10B|100B] [--edu]
                                         [--shard-size N] [--workers N] [--tokenizer DIR]

--input DIR: local parquet or jsonl files (*.parquet, *.jsonl, *.jsonl.gz, below DIR) with a "text" column, as
the Hub's dataset holds them (parquet through pyarrow, which scripts/setup.sh installs); without it the subset
(sample/10BT or sample/100BT of HuggingFaceFW/fineweb, or fineweb-edu with --edu) is downloaded with
huggingface_hub into OUT/download when the network allows. Default out: dev/data/fineweb10B (edu_fineweb10B).

The shards: every --shard-size tokens (100M) one file, the first PREFIX_val_000000.bin, then
PREFIX_train_000001.bin, ... (PREFIX fineweb or edufineweb), the last one shorter. The documents in order (the input
files sorted by path, their rows in order), each after GPT-2's <|endoftext|> (50256); a document runs on into the
next shard where one fills. With --tokenizer DIR a Hugging Face tokenizer's ids instead, each document after its
BOS (its EOS if it has none), as tinyshakespeare.py does; past 65,535 ids the shards are uint32 (version 7).

Tokenized in parallel (--workers, default the cores), with a progress line (documents, tokens/s, ETA) on stderr.
Resumable: each shard is written whole (SHARD.tmp, renamed) and then the manifest (OUT/PREFIX_manifest.json,
written to a temporary name and renamed) records it with where the next shard starts: the input file, the row,
the token offset inside that row's document. A rerun after a kill continues after the last shard the manifest
records and writes the same files as an uninterrupted run (a shard written without its manifest entry is written
again, identically). A manifest of other inputs or settings is refused. Bad input (no input files, a file
without a "text" column, a row that is not a string) is one line "error: ..." and no half-written shard.
"""
import argparse
import glob
import signal
import gzip
import json
import multiprocessing
import os
import struct
import sys
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cli import fail  # noqa: E402
from tinyshakespeare import make_tokenizer  # noqa: E402

SUBSETS = {("10B", False): ("HuggingFaceFW/fineweb", "sample/10BT/*"),
           ("100B", False): ("HuggingFaceFW/fineweb", "sample/100BT/*"),
           ("10B", True): ("HuggingFaceFW/fineweb-edu", "sample/10BT/*"),
           ("100B", True): ("HuggingFaceFW/fineweb-edu", "sample/100BT/*")}


# ----------------------------------------------------------------------------
# the inputs: (path, number of rows), and their rows from a position

def input_files(d):
    files = sorted(p for ext in ("*.parquet", "*.jsonl", "*.jsonl.gz")
                   for p in glob.glob(os.path.join(d, "**", ext), recursive=True))
    if not files:
        fail(f"--input {d}: no *.parquet, *.jsonl or *.jsonl.gz files in it")
    return files


def parquet_file(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        fail(f"{path}: reading parquet needs pyarrow (bash scripts/setup.sh installs it into .venv), or give jsonl")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:   # not parquet, truncated: whatever pyarrow raises
        fail(f"{path}: not a readable parquet file ({str(e)[:120]})")
    if "text" not in pf.schema_arrow.names:
        fail(f"{path}: no 'text' column (its columns: {', '.join(pf.schema_arrow.names)[:120]})")
    return pf


def jsonl_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for line in f:
                if line.strip():
                    yield line
    except (OSError, EOFError) as e:
        fail(f"{path}: cannot read it ({e})")


def count_rows(path):
    if path.endswith(".parquet"):
        return parquet_file(path).metadata.num_rows
    return sum(1 for _ in jsonl_lines(path))


def rows_from(path, start):
    """the texts of path's rows from row start on"""
    if path.endswith(".parquet"):
        pf = parquet_file(path)
        row = 0
        for g in range(pf.num_row_groups):   # whole row groups before start are skipped unread
            n = pf.metadata.row_group(g).num_rows
            if row + n <= start:
                row += n
                continue
            for text in pf.read_row_group(g, columns=["text"]).column("text").to_pylist():
                if row >= start:
                    if not isinstance(text, str):
                        fail(f"{path}: row {row}: 'text' is {type(text).__name__}, expected a string")
                    yield text
                row += 1
        return
    for row, line in enumerate(jsonl_lines(path)):
        if row < start:
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            fail(f"{path}: row {row}: not valid JSON ({str(e)[:80]})")
        text = doc.get("text") if isinstance(doc, dict) else None
        if not isinstance(text, str):
            fail(f"{path}: row {row}: no 'text' string")
        yield text


# ----------------------------------------------------------------------------
# tokenizing in worker processes, in order

_tok = None


def _init_worker(kind):
    global _tok
    _tok = make_tokenizer(kind)


def _encode(text):
    return [_tok.eot] + _tok.encode(text)   # (eot: GPT-2's <|endoftext|>, or the HF tokenizer's BOS / EOS)


# ----------------------------------------------------------------------------
# shards and the manifest

def write_shard(path, tokens, width):
    """llm.c's shard, whole or not at all (path.tmp renamed)"""
    magic, version = (20240520, 1) if width == 2 else (20240801, 7)
    header = struct.pack("<256i", magic, version, len(tokens), *([0] * 253))
    body = array("H" if width == 2 else "I", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    body = body.tobytes()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_manifest(path, m):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(m, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Progress:
    def __init__(self, total, done):
        self.total, self.done0, self.t0, self.last = total, done, time.time(), 0.0

    def show(self, docs, tokens, final=False):
        now = time.time()
        if not final and now - self.last < 0.5:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = (docs - self.done0) / dt
        eta = (self.total - docs) / rate if rate > 0 else 0.0
        sys.stderr.write(f"\r{docs:,}/{self.total:,} documents | {tokens / dt:,.0f} tokens/s | ETA "
                         f"{int(eta // 60)}:{int(eta % 60):02d}   " + ("\n" if final else ""))
        sys.stderr.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", help="local parquet / jsonl files (default: download the subset)")
    ap.add_argument("--out", help="the shards' directory (default dev/data/fineweb10B, or edu_fineweb10B)")
    ap.add_argument("--version", default="10B", choices=("10B", "100B"))
    ap.add_argument("--edu", action="store_true", help="FineWeb-Edu")
    ap.add_argument("--shard-size", type=int, default=10**8, help="tokens per shard (100M)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tokenizer", default="gpt2", metavar="gpt2|DIR")
    a = ap.parse_args()
    if a.shard_size < 1 or a.workers < 1:
        fail("--shard-size and --workers must be at least 1")
    prefix = "edufineweb" if a.edu else "fineweb"
    out = a.out or os.path.join(HERE, f"{'edu_' if a.edu else ''}fineweb{a.version}")
    os.makedirs(out, exist_ok=True)
    src = a.input
    if src is None:
        repo, pattern = SUBSETS[(a.version, a.edu)]
        src = os.path.join(out, "download")
        try:
            from huggingface_hub import snapshot_download
            snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=pattern, local_dir=src)
        except Exception as e:
            fail(f"cannot download {repo} {pattern} ({str(e)[:100]}): give local parquet or jsonl files with --input DIR")
    files = input_files(src)
    tok = make_tokenizer(a.tokenizer)
    width = 2 if tok.vocab_size <= 65536 else 4
    rel = [os.path.relpath(p, src) for p in files]
    settings = {"inputs": rel, "shard_size": a.shard_size, "tokenizer": a.tokenizer, "prefix": prefix}
    mpath = os.path.join(out, f"{prefix}_manifest.json")
    m = {**settings, "shards": []}
    if os.path.exists(mpath):
        try:
            m = json.load(open(mpath))
        except ValueError:
            fail(f"{mpath}: not valid JSON: delete it (and the shards) to start again")
        if {k: m.get(k) for k in settings} != settings:
            fail(f"{mpath} records other inputs or settings (shard size, tokenizer): use another --out, or delete it")
    # where the next shard starts: (file index, row, token offset inside that row's document)
    fi, row, off = (m["shards"][-1]["next"] if m["shards"] else (0, 0, 0))
    rows = [count_rows(p) for p in files]
    total, docs_before = sum(rows), sum(rows[:fi]) + row
    prog = Progress(total, docs_before)
    buf, tokens_seen, index = array("I"), 0, len(m["shards"])
    # (the test's kill: "N" SIGKILL after shard N's file, before its manifest entry; "mid:N" after its manifest entry,
    # at the next document, the next shard half made)
    hook = os.environ.get("FINEWEB_TEST_KILL", "-1")
    kill_at, kill_mid = (-1, int(hook[4:])) if hook.startswith("mid:") else (int(hook), -1)
    pool = multiprocessing.Pool(a.workers, initializer=_init_worker, initargs=(a.tokenizer,))

    def emit(next_pos):
        nonlocal buf, index
        name = f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.bin"
        write_shard(os.path.join(out, name), buf[:a.shard_size], width)
        if index == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        m["shards"].append({"file": name, "tokens": min(len(buf), a.shard_size), "next": next_pos})
        save_manifest(mpath, m)
        buf = buf[a.shard_size:]
        index += 1

    docs = docs_before
    try:
        for f in range(fi, len(files)):
            start = row if f == fi else 0
            for r, ids in enumerate(pool.imap(_encode, rows_from(files[f], start), chunksize=16), start):
                if f == fi and r == row and off:
                    ids = ids[off:]   # (the part the last recorded shard already holds)
                    doc_off = off
                else:
                    doc_off = 0
                # the shard boundary can fall inside this document: note where, as (file, row, offset)
                while len(buf) + len(ids) >= a.shard_size:
                    take = a.shard_size - len(buf)
                    buf.extend(ids[:take])
                    ids = ids[take:]
                    doc_off += take
                    done = len(ids) == 0
                    emit([f, r + 1, 0] if done else [f, r, doc_off])
                    if done:
                        break
                buf.extend(ids)
                if 0 <= kill_mid < index:
                    os.kill(os.getpid(), signal.SIGKILL)
                tokens_seen += len(ids)
                docs += 1
                prog.show(docs, tokens_seen)
        if buf:
            emit([len(files), 0, 0])
    finally:
        pool.terminate()
    prog.show(docs, tokens_seen, final=True)
    print(f"{len(m['shards'])} shards in {out} ({sum(s['tokens'] for s in m['shards']):,} tokens, "
          f"{'uint16' if width == 2 else 'uint32'}); manifest {mpath}")


if __name__ == "__main__":
    main()
