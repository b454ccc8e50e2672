#!/usr/bin/env python3
"""The Python peer of `sweep-bench data`: pretokenized loaders written the way a
PyTorch study's dataset classes usually are (and the reference study's were):
the Parquet table read into memory with pyarrow, then one document at a time as
Python lists, building the same samples as sweep (right-padded rows; a token
buffer with one BOS per document boundary and labels -100 at BOS).

    python3 scripts/python-loaders.py --padded padded.parquet \
        --token-list token-list.parquet --seq-len 2048 --samples 1000 --bos 1

Prints one JSON object: microseconds per sample for each loader given. `sweep
data` runs it beside its own loaders on the same files.
"""
import argparse
import json
import time

import pyarrow.parquet as pq

IGNORE = -100


def padded(path, seq, samples):
    table = pq.read_table(path, columns=["input_ids", "attention_mask"])
    ids, mask = table.column("input_ids"), table.column("attention_mask")
    n = len(table)
    started = time.perf_counter()
    for s in range(samples):
        row = ids[s % n].as_py()
        m = mask[s % n].as_py()
        inputs = row[:seq]
        labels = [t if keep else IGNORE for t, keep in zip(row[1:], m[1:])]
        assert len(inputs) == len(labels) == seq
    return time.perf_counter() - started


def token_list(path, seq, samples, bos):
    tokens = pq.read_table(path, columns=["tokens"]).column("tokens")
    n = len(tokens)
    buffer, doc = [], 0
    started = time.perf_counter()
    for _ in range(samples):
        while len(buffer) <= seq:
            ids = tokens[doc % n].as_py()
            doc += 1
            if buffer and ids and buffer[-1] == bos and ids[0] == bos:
                ids = ids[1:]
            buffer.extend(ids)
        window = buffer[: seq + 1]
        inputs = window[:seq]
        labels = [IGNORE if x == bos else y for x, y in zip(window[:seq], window[1:])]
        buffer = buffer[seq:]
        assert len(inputs) == len(labels) == seq
    return time.perf_counter() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--padded")
    p.add_argument("--token-list")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--bos", type=int, default=1)
    a = p.parse_args()
    out = {}
    if a.padded:
        out["pretokenized padded"] = padded(a.padded, a.seq_len, a.samples) * 1e6 / a.samples
    if a.token_list:
        secs = token_list(a.token_list, a.seq_len, a.samples, a.bos)
        out["pretokenized token-list"] = secs * 1e6 / a.samples
    print(json.dumps(out))


if __name__ == "__main__":
    main()
