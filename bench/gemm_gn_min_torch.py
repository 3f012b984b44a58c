# PyTorch peer of bench/gemm_gn_min.cpp: the Linear + GroupNorm + min + bias model on
# x [1024, 8192] (eager, and torch.compile unless --no-compile) against its own GEMM, in
# float32, float32 with TF32 matmuls, and bfloat16; forward and forward+backward, median of
# CUDA-event timings after warm-up. Prints the same table; --json writes one line per row.
#   python3 bench/gemm_gn_min_torch.py [--reps N] [--no-compile] [--json FILE]
import argparse, json

import torch
import torch.nn.functional as F

B, FEATURES, GROUPS = 1024, 8192, 512


def median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    dev = "cuda"
    rows = []
    print("%-5s %-16s %9s %8s %12s %8s" % ("mode", "what", "fwd ms", "x gemm", "fwd+bwd ms", "x gemm"))
    for mode, dtype, tf32 in (("f32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.manual_seed(0)
        x = torch.randn(B, FEATURES, device=dev, dtype=dtype, requires_grad=True)
        lin = torch.nn.Linear(FEATURES, FEATURES, device=dev, dtype=dtype)
        gn = torch.nn.GroupNorm(GROUPS, FEATURES, device=dev, dtype=dtype)
        bias = torch.randn(1, FEATURES, 1, 1, device=dev, dtype=dtype, requires_grad=True)
        params = [x, bias, *lin.parameters(), *gn.parameters()]

        def gemm(x):
            return x @ lin.weight.t()

        def model(x):
            y = gn(lin(x))
            return torch.min(y, dim=1, keepdim=True)[0] + bias

        variants = [("gemm", gemm), ("eager", model)]
        if not a.no_compile:
            variants.append(("compile", torch.compile(model)))
        gemm_fwd = gemm_step = None
        for what, fn in variants:
            with torch.no_grad():
                fwd = median_ms(lambda: fn(x), a.reps)
                grad = torch.randn_like(fn(x))

            def step():
                for t in params:
                    t.grad = None
                fn(x).backward(grad)

            fwd_bwd = median_ms(step, a.reps)
            if what == "gemm":
                gemm_fwd, gemm_step = fwd, fwd_bwd
            print("%-5s %-16s %9.4f %7.3fx %12.4f %7.3fx" % (mode, what, fwd, fwd / gemm_fwd, fwd_bwd,
                                                             fwd_bwd / gemm_step), flush=True)
            rows.append(dict(case="gemm_gn_min_1024x8192x8192", impl="torch " + torch.__version__, mode=mode,
                             what=what, fwd_ms=round(fwd, 5), fwd_bwd_ms=round(fwd_bwd, 5)))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
