#!/usr/bin/env python3
"""Runs every case of bench/norms in a process of its own, --runs times (round after round,
so slow drift spreads over all cases), and logs the GPU's SM clock, temperature and power
before each run. A case measured after seconds of the 7.5 GB cases comes out slower than on
its own (docs/PERFORMANCE.md); a fresh process per case, with the state of the GPU on
record, keeps that order effect out of the figures. Prints per case the median and the
range of the forward and forward+backward times and their fraction of copy bandwidth, and
writes one JSON line per case with every run.
    python3 bench/norms_fresh.py NORMS_BINARY [--runs 3] [--filter SUBSTRING] [--no-sweep] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def gpu_state():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        sm, temp, power = (v.strip() for v in out.split(","))
        return {"sm_mhz": float(sm), "temp_c": float(temp), "power_w": float(power)}
    except Exception:  # no nvidia-smi: the figures stand without it
        return {}


def run_case(binary, name, sweep):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        cmd = [binary, "--case", name, "--json", path] + ([] if sweep else ["--no-sweep"])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr.strip()}")
        with open(path) as f:
            return json.loads(f.readline())
    finally:
        os.unlink(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--filter", default="")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    listing = [a.binary, "--list"] + (["--no-sweep"] if a.no_sweep else [])
    names = [n for n in subprocess.run(listing, capture_output=True, text=True, check=True).stdout.split()
             if a.filter in n]
    runs = {n: [] for n in names}
    for r in range(a.runs):
        for n in names:
            state = gpu_state()
            result = run_case(a.binary, n, not a.no_sweep)
            result.update(state)
            runs[n].append(result)
            print(f"run {r + 1}/{a.runs} {n}: {result['fwd_ms']:.4f} / {result['fwd_bwd_ms']:.4f} ms"
                  + (f" (SM {state['sm_mhz']:.0f} MHz, {state['temp_c']:.0f} C, {state['power_w']:.0f} W before)"
                     if state else ""), file=sys.stderr, flush=True)
    print(f"\n{'case':34} {'dtype':5} {'fwd ms median (range)':>26} {'copy':>5} "
          f"{'fwd+bwd ms median (range)':>28} {'copy':>5}")
    out = open(a.json, "w") if a.json else None
    for n in names:
        rs = runs[n]
        fwd = [r["fwd_ms"] for r in rs]
        both = [r["fwd_bwd_ms"] for r in rs]
        fwd_copy = statistics.median(r["fwd_copy_fraction"] for r in rs)
        both_copy = statistics.median(r["fwd_bwd_copy_fraction"] for r in rs)
        print(f"{n:34} {rs[0]['dtype']:5} {statistics.median(fwd):9.4f} ({min(fwd):.4f}-{max(fwd):.4f}) "
              f"{100 * fwd_copy:4.0f}% {statistics.median(both):10.4f} ({min(both):.4f}-{max(both):.4f}) "
              f"{100 * both_copy:4.0f}%")
        if out:
            out.write(json.dumps({"case": n, "dtype": rs[0]["dtype"], "fwd_ms_median": statistics.median(fwd),
                                  "fwd_bwd_ms_median": statistics.median(both), "fwd_copy_fraction": fwd_copy,
                                  "fwd_bwd_copy_fraction": both_copy, "runs": rs}) + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
