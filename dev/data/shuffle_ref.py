"""
llm.c's shuffled data order, computed independently of the C code, to check llmc/dataloader.h.

MT19937 is written here from the published algorithm (Matsumoto and Nishimura, 1998) and checked
against its reference outputs and, when numpy is present, against numpy's MT19937 bit generator
(legacy seeding = the reference init_genrand). The order follows llm.c's DataLoader as a state
machine (shard index, sample index; a batch asked for past the end of a shard first advances to
the next shard, or resets after the last one):
  - the generator of process rank r is seeded with 42 + r
  - reset (at init and at every epoch end): shuffle the shard index list in place (it is never put
    back to the identity), load the first shard of the list, shuffle the identity over its samples
  - advance (end of a shard that is not the last): next shard of the list, shuffle its samples
  - a shard's samples: (ntok - 1) // (num_processes * B * T); process r reads B*T+1 tokens at
    sample * num_processes * B * T + r * B * T
  - shuffle(a): for i = n-1 down to 1: j = next32() % (i+1); swap a[i], a[j]

Usage:
  python3 dev/data/shuffle_ref.py --selftest
  python3 dev/data/shuffle_ref.py --files 'shard_*.bin' -B 2 -T 16 --dp 2 --rank 1 --batches 50 [--no-shuffle] [--seed-offset 0]
prints one line per batch: "FILE_INDEX OFFSET FIRST_INPUT LAST_TARGET SUM_INPUTS" (FILE_INDEX in
sorted glob order, like glob(3)); the C harness dev/data/dataloader_order.c prints the same.
"""

import argparse
import glob
import struct
import sys


class MT19937:
    N, M = 624, 397

    def __init__(self, seed):
        x = [seed & 0xFFFFFFFF]
        for i in range(1, self.N):
            x.append((1812433253 * (x[-1] ^ (x[-1] >> 30)) + i) & 0xFFFFFFFF)
        self.x = x
        self.i = self.N

    def _twist(self):
        x, N, M = self.x, self.N, self.M
        for k in range(N):
            y = (x[k] & 0x80000000) | (x[(k + 1) % N] & 0x7FFFFFFF)
            x[k] = x[(k + M) % N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.i = 0

    def next32(self):
        if self.i >= self.N:
            self._twist()
        y = self.x[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF


def shuffle(a, rng):
    for i in range(len(a) - 1, 0, -1):
        j = rng.next32() % (i + 1)
        a[i], a[j] = a[j], a[i]


def selftest():
    g = MT19937(5489)
    got = [g.next32() for _ in range(3)]
    assert got == [3499211612, 581869302, 3890346734], got
    g = MT19937(5489)
    for _ in range(9999):
        g.next32()
    assert g.next32() == 4123659995  # the 10000th output for the default seed (C++ std::mt19937)
    msg = "MT19937 reference values ok"
    try:
        import numpy as np
        for seed in (42, 43, 1337):
            bg = np.random.MT19937(0)
            bg._legacy_seeding(seed)
            ours = MT19937(seed)
            raw = bg.random_raw(2000)
            assert all(int(r) == ours.next32() for r in raw), seed
        msg += ", equal to numpy's MT19937 for 2000 draws of seeds 42, 43, 1337"
    except ImportError:
        msg += " (numpy absent: no cross-check)"
    print(msg)


def read_shard(path):
    """The tokens of an llm.c shard: magic 20240520 version 1 (uint16) or 20240801 version 7 (uint32)."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        code = {(20240520, 1): "H", (20240801, 7): "I"}.get(header[:2])
        assert code, path
        ntok = header[2]
        toks = struct.unpack("<%d%s" % (ntok, code), f.read(struct.calcsize(code) * ntok))
    return toks


def llmc_order(shards, B, T, dp, rank, batches, shuffle_on, seed_offset):
    """Yields (file index, token offset) for `batches` batches of process `rank`, as llm.c reads them."""
    n = len(shards)
    rng = MT19937((42 + rank + seed_offset) & 0xFFFFFFFF)
    shard_indices = list(range(n))
    state = {}

    def samples_of(k):
        return (len(shards[k]) - 1) // (dp * B * T)

    def load(pos):
        state["file"] = shard_indices[pos] if shuffle_on else pos
        state["nsamples"] = samples_of(state["file"])
        if shuffle_on:
            intra = list(range(state["nsamples"]))
            shuffle(intra, rng)
            state["intra"] = intra

    def reset():
        state["shard"] = 0
        state["sample"] = 0
        if shuffle_on:
            shuffle(shard_indices, rng)
        load(0)

    def advance():
        if state["shard"] == n - 1:
            reset()
            return
        state["shard"] += 1
        state["sample"] = 0
        load(state["shard"])

    reset()
    for _ in range(batches):
        if state["sample"] >= state["nsamples"]:
            advance()
        idx = state["intra"][state["sample"]] if shuffle_on else state["sample"]
        state["sample"] += 1
        yield state["file"], idx * dp * B * T + rank * B * T


def main():
    p = argparse.ArgumentParser(description="llm.c's (shuffled) data order, independently computed")
    p.add_argument("--selftest", action="store_true")
    p.add_argument("--files")
    p.add_argument("-B", type=int, default=4)
    p.add_argument("-T", type=int, default=64)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--seed-offset", type=int, default=0, help="our --seed minus 1337")
    a = p.parse_args()
    if a.selftest:
        selftest()
        return
    paths = sorted(glob.glob(a.files))
    if not paths:
        sys.exit("no files match %s" % a.files)
    shards = [read_shard(q) for q in paths]
    BT = a.B * a.T
    for f, off in llmc_order(shards, a.B, a.T, a.dp, a.rank, a.batches, not a.no_shuffle, a.seed_offset):
        t = shards[f]
        print(f, off, t[off], t[off + BT], sum(t[off:off + BT]))


if __name__ == "__main__":
    main()
