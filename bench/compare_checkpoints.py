#!/usr/bin/env python3
"""Compares the tensors two safetensors files share (f32, f64, i64 and i32; others are
skipped and counted) and prints the largest absolute difference; exits 1 when it exceeds
--tolerance (default 0: identical) or when a tensor's shape or dtype differs.
    python3 bench/compare_checkpoints.py A.safetensors B.safetensors [--tolerance T]
Keys starting with --skip (default "optim.", the optimizer state) are left out."""
import argparse
import array
import json
import struct
import sys

CODES = {"F32": "f", "F64": "d", "I64": "q", "I32": "i"}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, blob[8 + n:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--skip", default="optim.")
    args = parser.parse_args()
    ha, da = load(args.a)
    hb, db = load(args.b)
    worst, worst_key, compared, skipped = 0.0, "", 0, 0
    for key, ea in sorted(ha.items()):
        if args.skip and key.startswith(args.skip):
            continue
        eb = hb.get(key)
        if eb is None or eb["dtype"] != ea["dtype"] or eb["shape"] != ea["shape"]:
            print(f"{key}: missing or of another shape or dtype in {args.b}")
            return 1
        code = CODES.get(ea["dtype"])
        if code is None:
            skipped += 1
            continue
        va = array.array(code, da[ea["data_offsets"][0]:ea["data_offsets"][1]])
        vb = array.array(code, db[eb["data_offsets"][0]:eb["data_offsets"][1]])
        diff = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        if diff > worst:
            worst, worst_key = diff, key
        compared += 1
    print(f"compared {compared} tensors ({skipped} of other dtypes skipped): largest |difference| {worst:g}"
          + (f" in {worst_key}" if worst_key else ""))
    return 0 if worst <= args.tolerance and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
