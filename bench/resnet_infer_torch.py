# PyTorch peer of bench/resnet_infer.cpp: torchvision's ResNet (random weights, eval mode,
# torch.inference_mode) on the GPU, a batch of 224 x 224 images at each batch size, in TF32
# (f32, TF32 tensor cores for convolutions and matrix products) and in bf16 and f16 (model
# and images converted): eager in all three, under torch.compile in TF32 and bf16, and in bf16
# also under torch.compile with the channels-last layout (PyTorch's fastest form for
# convolutions on tensor cores; normcore's tensors are NCHW). CUDA-event medians of --reps after warm-up, a table line and a JSON line
# per row.
#   python3 bench/resnet_infer_torch.py [--model resnet50] [--batch 1,64] [--reps N]
import argparse
import json
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_gn_min_torch import median_ms  # noqa: E402 (CUDA-event median after warm-up)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", default="1,64")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(f"{'model':10} {'dtype':5} {'batch':>6} {'mode':14} {'ms':>10} {'images/s':>12}")
    for name, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)):
        for batch in (int(b) for b in args.batch.split(",")):
            # torch.compile takes about a minute a model: TF32 and bf16 only, channels-last in bf16.
            modes = {"tf32": ("eager", "compile"), "bf16": ("eager", "compile", "compile-nhwc"), "f16": ("eager",)}
            for mode in modes[name]:
                torch.manual_seed(0)
                model = getattr(torchvision.models, args.model)(num_classes=1000).cuda().to(dtype).eval()
                images = torch.randn(batch, 3, 224, 224, device="cuda").to(dtype)
                if mode == "compile-nhwc":
                    model = model.to(memory_format=torch.channels_last)
                    images = images.contiguous(memory_format=torch.channels_last)
                run = torch.compile(model) if mode.startswith("compile") else model
                with torch.inference_mode():
                    ms = median_ms(lambda: run(images), args.reps)
                rate = batch / (ms * 1e-3)
                print(f"{args.model:10} {name:5} {batch:6} {mode:14} {ms:10.3f} {rate:12.0f}", flush=True)
                print(json.dumps({"impl": f"torch {mode}", "model": args.model, "dtype": name, "batch": batch,
                                  "mode": mode, "ms": round(ms, 4), "images_per_s": round(rate)}), flush=True)


if __name__ == "__main__":
    main()
