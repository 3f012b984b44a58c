# PyTorch peer of bench/conv.cpp: the same convolution cases (F.conv2d on cuDNN, f32 with
# TF32 off, TF32, bf16; forward and forward+backward of x and weight) and the same
# BatchNorm / GroupNorm cases (eager and torch.compile), timed the same way (CUDA-event
# medians after a warm-up). One JSON line per case and implementation.
#   python3 bench/conv_torch.py [--filter SUBSTRING] [--reps N] [--benchmark] [--no-compile]
import argparse, json

import torch
import torch.nn.functional as F


def median_ms(fn, reps, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def fwd_and_bwd(forward, inputs, grad, reps):
    fwd = median_ms(lambda: forward(*inputs), reps)
    leaves = [t.detach().requires_grad_() for t in inputs]

    def step():
        for t in leaves:
            t.grad = None
        forward(*leaves).backward(grad)

    return fwd, median_ms(step, reps)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--filter", default="")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = a.benchmark
    dev = "cuda"
    torch.manual_seed(1)
    shapes = [("64x64x56x56", 64, 64, 56), ("64x256x14x14", 64, 256, 14)]

    for label, n, c, hw in shapes:
        name = f"conv3x3_{label}"
        if a.filter not in name:
            continue
        for mode in ("f32", "tf32", "bf16"):
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            dt = torch.bfloat16 if mode == "bf16" else torch.float32
            x = torch.randn(n, c, hw, hw, device=dev, dtype=dt)
            w = torch.randn(c, c, 3, 3, device=dev, dtype=dt) * 0.05
            grad = torch.randn(n, c, hw, hw, device=dev, dtype=dt)
            fwd, fb = fwd_and_bwd(lambda x, w: F.conv2d(x, w, padding=1), [x, w], grad, a.reps)
            print(json.dumps(dict(case=name, mode=mode, impl="pytorch", version=torch.__version__,
                                  cudnn=torch.backends.cudnn.version(), benchmark=a.benchmark, fwd_ms=round(fwd, 4), fwd_bwd_ms=round(fb, 4))), flush=True)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    def batch_norm(x, w, b, mean, var):
        return F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1, eps=1e-5)

    def group_norm(x, w, b):
        return F.group_norm(x, 32, w, b)

    for label, n, c, hw in shapes:
        for op in ("batchnorm", "groupnorm_g32"):
            name = f"{op}_{label}"
            if a.filter not in name:
                continue
            for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
                x = torch.randn(n, c, hw, hw, device=dev, dtype=dt)
                w, b = torch.ones(c, device=dev, dtype=dt), torch.zeros(c, device=dev, dtype=dt)
                mean, var = torch.zeros(c, device=dev, dtype=dt), torch.ones(c, device=dev, dtype=dt)
                grad = torch.randn_like(x)
                impls = [("eager", batch_norm if op == "batchnorm" else group_norm)]
                if not a.no_compile:
                    impls.append(("compile", torch.compile(impls[0][1])))
                for impl, fn in impls:
                    if op == "batchnorm":
                        forward = lambda x, w, b, fn=fn: fn(x, w, b, mean, var)
                    else:
                        forward = fn
                    fwd, fb = fwd_and_bwd(forward, [x, w, b], grad, a.reps)
                    print(json.dumps(dict(case=name, dtype=tag, impl=f"pytorch-{impl}", version=torch.__version__,
                                          fwd_ms=round(fwd, 4), fwd_bwd_ms=round(fb, 4))), flush=True)


if __name__ == "__main__":
    main()
