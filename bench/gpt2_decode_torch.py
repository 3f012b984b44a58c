# PyTorch peer of bench/gpt2_decode.cpp: transformers' GPT2LMHeadModel (GPT-2 124M config,
# random weights, eval mode, torch.inference_mode) on the GPU, in f32 (TF32 matrix products)
# and bf16 (model converted): the prefill of a --prompt-tokens prompt (one forward, CUDA-event
# median), and batch-1 greedy generate() of --tokens new tokens after an 8-token prompt
# (wall-clock median of whole calls, as normcore's), eager with the dynamic cache and, with
# unless --no-compile, with a static cache and the forward under torch.compile, with CUDA
# graphs (reduce-overhead) and without (minutes: it compiles).
# A table line and a JSON line per row.
# With --device cpu: f32 eager on --threads threads (torch.set_num_threads), wall-clock medians.
#   python3 bench/gpt2_decode_torch.py [--tokens 256] [--prompt-tokens 1024] [--reps 5] [--no-compile]
#                                      [--device cuda|cpu] [--threads N]
import argparse
import json
import os
import statistics
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_gn_min_torch import median_ms  # noqa: E402 (CUDA-event median after warm-up)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn, reps):
    times = []
    for r in range(reps + 1):  # the first call warms up
        start = time.perf_counter()
        fn()
        if r > 0:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def generate_ms(model, prompt, tokens, reps, **kwargs):
    times = []
    for r in range(reps + 1):  # the first call warms up (and compiles)
        sync()
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0, **kwargs)
        sync()
        if r > 0:
            times.append((time.perf_counter() - start) * 1e3)
    assert out.shape[1] == prompt.shape[1] + tokens, out.shape
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    device = args.device
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"{'dtype':6} {'case':28} {'ms':>10} {'tokens/s':>12}")
    if device == "cpu":
        print(f"CPU, {torch.get_num_threads()} threads")
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        if device == "cpu" and dtype != torch.float32:
            continue
        torch.manual_seed(0)
        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config).to(device).to(dtype).eval()
        vocab = config.vocab_size
        with torch.inference_mode():
            prompt = torch.randint(0, vocab, (1, args.prompt_tokens), device=device)
            if device == "cpu":
                ms = wall_ms(lambda: model(prompt, logits_to_keep=1), args.reps)
            else:
                ms = median_ms(lambda: model(prompt, logits_to_keep=1), args.reps * 4)
            print(f"{name:6} prefill of {args.prompt_tokens:<17} {ms:10.3f} {args.prompt_tokens / ms * 1e3:12.0f}",
                  flush=True)
            print(json.dumps({"impl": "transformers", "dtype": name, "case": "prefill", "ms": round(ms, 4)}))
            start = torch.tensor([[(i * 7919) % vocab for i in range(8)]], device=device)
            modes = [("eager", {})]
            if not args.no_compile and device == "cuda":
                # CUDA graphs (reduce-overhead) first; transformers' static cache mutates a
                # counter that some versions' graphs refuse, so also plain inductor kernels.
                modes += [("compile", {"cache_implementation": "static"}),
                          ("compile-nograph", {"cache_implementation": "static"})]
            eager_forward = model.forward
            for mode, kwargs in modes:
                torch._dynamo.reset()
                if mode == "compile":
                    model.forward = torch.compile(eager_forward, mode="reduce-overhead", fullgraph=True)
                elif mode == "compile-nograph":
                    model.forward = torch.compile(eager_forward, fullgraph=True)
                try:
                    ms = generate_ms(model, start, args.tokens, args.reps, **kwargs)
                except Exception as e:  # report and go on: the other rows still count
                    print(f"{name:6} decode {mode}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                print(f"{name:6} decode {args.tokens} greedy, {mode:15} {ms:10.3f} {args.tokens / ms * 1e3:12.0f}"
                      f"  ({ms / args.tokens:.3f} ms a token)", flush=True)
                print(json.dumps({"impl": f"transformers {mode}", "dtype": name, "case": "decode",
                                  "ms": round(ms, 4)}))


if __name__ == "__main__":
    main()
