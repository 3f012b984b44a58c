# PyTorch peer of bench/mlp_epoch.cpp: the same model (mlp, cnn-gn or cnn-bn), initialisation
# scheme, optimizer, loss, clipping, batch size and data normalisation, timed the same way
# (best epoch after a 20-step warm-up), then test accuracy. Reads the Fashion-MNIST .gz files
# directly. --compile runs the model through torch.compile (--compile-mode reduce-overhead:
# its CUDA-graph mode, which graphs the model's forward and backward). --precision as normcore's: fp32
# (TF32 off, the default), tf32, bf16 or fp16 (torch.autocast; fp16 with a GradScaler).
# Under torchrun (WORLD_SIZE set) it trains with DistributedDataParallel over NCCL on
# cuda:LOCAL_RANK, each rank a 1/N share of every epoch with --batch-size per rank, and rank 0
# reports: the peer of mlp_epoch under `normcore launch`.
#   python3 bench/mlp_epoch_torch.py [--model NAME] [--compile] [--precision P] [--device cpu|cuda] [--epochs N]
#                                    [--data DIR]
import argparse, gzip, json, os, struct, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 256),
                             nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 10))
    # normcore's cnn-gn / cnn-bn (models/models.cpp), layer for layer.
    layers, c_in = [], 1
    for c in (32, 64):
        for _ in range(2):
            layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False),
                       nn.GroupNorm(8, c) if name == "cnn-gn" else nn.BatchNorm2d(c), nn.ReLU()]
            c_in = c
        layers.append(nn.MaxPool2d(2))
    layers += [nn.Flatten(), nn.Dropout(0.3), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Dropout(0.3),
               nn.Linear(256, 10)]
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn-gn", "cnn-bn"])
    p.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
                   help="CPU threads for PyTorch (default: the cores, shared among the local ranks)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    ddp = "WORLD_SIZE" in os.environ
    if ddp:
        torch.distributed.init_process_group("nccl")
        a.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(a.device)
    dev = torch.device(a.device)
    torch.manual_seed(0)

    def load(prefix):
        x = read_idx(f"{a.data}/{prefix}-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530)
        y = read_idx(f"{a.data}/{prefix}-labels-idx1-ubyte.gz").long()
        return x.unsqueeze(1), y

    xtr, ytr = load("train")
    xte, yte = load("t10k")
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    lower = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(dev.type) if a.precision == "fp16" else None
    model = make_model(a.model).to(dev)
    train_model = torch.compile(model, mode=a.compile_mode) if a.compile else model
    if ddp:
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)

    epoch_seed = [0]

    def batches(n=None):
        # The same order on every rank; rank r takes every world-th sample from r.
        epoch_seed[0] += 1
        perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(epoch_seed[0]))[rank::world]
        for i, s in enumerate(range(0, len(perm), a.batch_size)):
            if n is not None and i >= n:
                return
            idx = perm[s:s + a.batch_size]
            # Gather and normalise on the host and copy, as normcore's loader does.
            yield xtr[idx].to(dev, non_blocking=True), ytr[idx].to(dev, non_blocking=True)

    def step(x, y):
        with torch.autocast(dev.type, dtype=lower or torch.bfloat16, enabled=lower is not None):
            loss = F.cross_entropy(train_model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(opt)
            scaler.update()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for x, y in batches(20):
        step(x, y)
    sync()
    best = float("inf")
    for _ in range(a.epochs):
        t = time.perf_counter()
        for x, y in batches():
            step(x, y)
        sync()
        best = min(best, time.perf_counter() - t)

    if ddp:
        torch.distributed.barrier()
        if rank != 0:
            torch.distributed.destroy_process_group()
            return
    model.eval()
    with torch.no_grad():
        correct = sum((model(xte[s:s + 1000].to(dev)).argmax(1).cpu() == yte[s:s + 1000]).sum().item()
                      for s in range(0, len(yte), 1000))
    acc = correct / len(yte)
    impl = ("pytorch-compile" + ("" if a.compile_mode == "default" else "-" + a.compile_mode)) if a.compile else "pytorch"
    if ddp:
        impl += f"-ddp{world}"
    print(f"{impl} {torch.__version__} {a.model} {a.precision} epoch on {dev}: {best:.3f} s ({len(ytr) / best:.0f} samples/s), "
          f"test accuracy {100 * acc:.2f}% after {a.epochs} epoch(s) (threads {torch.get_num_threads()})")
    print(json.dumps(dict(impl=impl, model=a.model, precision=a.precision, version=torch.__version__, device=str(dev), batch_size=a.batch_size,
                          epoch_s=round(best, 4), samples_per_s=round(len(ytr) / best), test_accuracy=acc,
                          epochs=a.epochs, world_size=world)))
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
