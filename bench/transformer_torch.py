# The PyTorch peer of bench/attention and of the transformer cases of bench/norms, run on the
# GPU machine in the same call: F.scaled_dot_product_attention with each of its CUDA back
# ends (flash, cuDNN, memory-efficient) at the same shapes, dtypes and causal flags, and
# F.rms_norm / F.layer_norm on tokens x hidden activations, eager and torch.compile. Times
# are CUDA-event medians after a warm-up, as bench/cuda_timing.h takes them.
#   python3 bench/transformer_torch.py [--only attention|norms] [--reps N] [--no-compile]
#                                      [--shapes BxHxLxD,...] (attention's shapes)
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def attention(reps, shapes):
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    print("%-34s %-10s %9s %7s %11s %7s" % ("case", "backend", "fwd ms", "TFLOP/s", "fwd+bwd ms", "TFLOP/s"))
    for b, h, n, d in shapes:
        for dtype, tag in [(torch.bfloat16, "bf16"), (torch.float16, "f16")]:
            for causal in [False, True]:
                name = f"sdpa_{tag}_{b}x{h}x{n}x{d}" + ("_causal" if causal else "")
                gen = torch.Generator(device="cuda").manual_seed(1)
                q, k, v, grad = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
                for backend, kind in backends.items():
                    try:
                        with sdpa_kernel(kind):
                            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)

                            def step():
                                qg.grad = kg.grad = vg.grad = None
                                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(grad)

                            fwd_bwd = median_ms(step, reps)
                    except RuntimeError as e:
                        print("%-34s %-10s unavailable: %s" % (name, backend, str(e).splitlines()[0][:60]))
                        continue
                    print("%-34s %-10s %9.3f %7.1f %11.3f %7.1f" % (name, backend, fwd, flops / fwd / 1e9, fwd_bwd,
                                                                  3.5 * flops / fwd_bwd / 1e9), flush=True)
                    print(json.dumps(dict(case=name, impl="torch-" + backend, fwd_ms=round(fwd, 4),
                                          fwd_bwd_ms=round(fwd_bwd, 4))))
                del q, k, v, grad, qg, kg, vg
                torch.cuda.empty_cache()


def norms(reps, compile_too):
    print("%-34s %-8s %9s %11s" % ("case", "impl", "fwd ms", "fwd+bwd ms"))
    for dtype, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        for hidden in [1024, 4096, 8192]:
            for op in ["rmsnorm", "layernorm"]:
                name = f"{op}_{tag}_16384x{hidden}"
                x = torch.randn(16384, hidden, device="cuda", dtype=dtype)
                w = torch.ones(hidden, device="cuda", dtype=dtype)
                b = torch.zeros(hidden, device="cuda", dtype=dtype)
                grad = torch.randn_like(x)
                if op == "rmsnorm":
                    fn = lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)
                else:
                    fn = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
                impls = [("eager", fn)] + ([("compile", torch.compile(fn))] if compile_too else [])
                for impl, f in impls:
                    fwd = median_ms(lambda: f(x, w, b), reps)
                    xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))

                    def step():
                        xg.grad = wg.grad = bg.grad = None
                        f(xg, wg, bg).backward(grad)

                    fwd_bwd = median_ms(step, reps)
                    print("%-34s %-8s %9.4f %11.4f" % (name, impl, fwd, fwd_bwd), flush=True)
                    print(json.dumps(dict(case=name, impl="torch-" + impl, fwd_ms=round(fwd, 5),
                                          fwd_bwd_ms=round(fwd_bwd, 5))))
                del x, w, b, grad
                torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["attention", "norms"])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--shapes", default="8x16x2048x64,4x32x4096x128,16x12x1024x64")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    print(torch.__version__, torch.cuda.get_device_name())
    if args.only in (None, "attention"):
        attention(args.reps, shapes)
    if args.only in (None, "norms"):
        norms(args.reps, not args.no_compile)
