# PyTorch peer of bench/infer.cpp: the same classifier (bench/mlp_epoch_torch.py's make_model),
# random weights, eval mode under torch.inference_mode(): the best batch forward of --reps
# after a warm-up, and the median latency of one image through normalization, forward,
# softmax and the copy to the host. --threads sets torch.set_num_threads (default: the cores).
#   python3 bench/infer_torch.py [--model NAME] [--device cpu|cuda] [--batch B] [--reps N] [--threads T]
import argparse, json, os, statistics, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlp_epoch_torch import make_model  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn-bn", choices=["mlp", "cnn-gn", "cnn-bn"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = make_model(a.model).to(dev).eval()
    images = torch.rand(a.batch, 1, 28, 28, device=dev)
    one = torch.rand(1, 1, 28, 28)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(3):
            model(images)
        sync()
        best = 1e30
        for _ in range(a.reps):
            start = time.perf_counter()
            model(images)
            sync()
            best = min(best, time.perf_counter() - start)

        def classify(x):
            x = (x.to(dev) - 0.2860) / 0.3530
            return torch.softmax(model(x), 1).cpu()

        for _ in range(20):
            classify(one)
        latencies = []
        for _ in range(max(a.reps * 10, 100)):
            start = time.perf_counter()
            classify(one)
            latencies.append(time.perf_counter() - start)
    latency = statistics.median(latencies)
    threads = torch.get_num_threads() if dev.type == "cpu" else 0
    print(f"torch {torch.__version__} {a.model} inference on {a.device} ({threads} CPU threads): batch {a.batch} "
          f"forward {best * 1e3:.3f} ms ({a.batch / best:.0f} images/s), one image {latency * 1e6:.1f} us")
    print(json.dumps({"impl": "torch", "version": torch.__version__, "model": a.model, "device": a.device,
                      "threads": threads, "batch": a.batch, "batch_forward_ms": round(best * 1e3, 4),
                      "images_per_s": round(a.batch / best), "one_image_us": round(latency * 1e6, 2)}))


if __name__ == "__main__":
    main()
