"""What dev/'s scripts share on the command line: bad input is one line 'error: ...' and a non-zero exit."""
import argparse
import sys


def fail(msg):
    sys.exit(f"error: {msg}")


class Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not the usage and then the message
        fail(f"{message} (see --help)")


def read_regular(path, limit=None, limit_what=""):
    """The bytes of path, a regular file (opened without blocking and checked before reading: a FIFO or a link to
    /dev/zero is refused, never read without end), read up to its size; with limit, a file of more bytes is
    refused as more than limit_what. One error line naming the file and the problem otherwise"""
    import os
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        fail(f"{path}: cannot open it: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            fail(f"{path}: not a regular file (a FIFO, a device, a folder or a link to one)")
        if limit is not None and st.st_size > limit:
            fail(f"{path}: {st.st_size} bytes: more than {limit_what}")
        parts, left = [], st.st_size
        while left > 0:
            b = os.read(fd, min(left, 1 << 30))
            if not b:
                break
            parts.append(b)
            left -= len(b)
        return b"".join(parts)
    except OSError as e:
        fail(f"{path}: cannot read it: {e.strerror}")
    finally:
        os.close(fd)


def read_json_file(path):
    """The JSON value in path, a regular file of at most 1 GiB (read_regular: a FIFO or a link to a device is
    refused, never read without end); one error line naming the file and the problem otherwise"""
    import json
    data = read_regular(path, 1 << 30, "a tokenizer's or config's 1 GiB")
    if not data.strip():
        fail(f"{path}: empty: expected a JSON object")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:   # not JSON, not UTF-8, nested too deep
        fail(f"{path}: not valid JSON ({str(e)[:120]})")


def check_tokenizer_dir(d):
    """--tokenizer DIR, before transformers reads it (whose errors blame a missing library): a directory whose
    tokenizer.json (the fast tokenizer's file; or a sentencepiece tokenizer.model, or GPT-2's vocab.json) and
    tokenizer_config.json, where present, are regular files of JSON objects; one error line naming the file and the
    problem otherwise"""
    import os
    if not os.path.isdir(d):
        fail(f"--tokenizer {d}: not a directory (expected a Hugging Face tokenizer directory)")
    tj = os.path.join(d, "tokenizer.json")
    if not os.path.lexists(tj) and not any(os.path.lexists(os.path.join(d, n)) for n in ("tokenizer.model", "vocab.json")):
        fail(f"--tokenizer {d}: no tokenizer.json (nor tokenizer.model, vocab.json) in it")
    for name, key in (("tokenizer.json", "model"), ("tokenizer_config.json", None)):
        path = os.path.join(d, name)
        if not os.path.lexists(path):
            continue
        x = read_json_file(path)
        if not isinstance(x, dict) or (key and not isinstance(x.get(key), dict)):
            fail(f"{path}: expected a JSON object{' with a ' + repr(key) + ' object (a tokenizer)' if key else ''}")
