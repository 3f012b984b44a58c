# PyTorch side of the same-weights loss-curve check of `normcore train-lm --model gpt2`:
# GPT-2 (bench/gpt_train_torch.py's GPT: normcore's module names, the head tied to tok_emb,
# GPT-2's initialization, the vocabulary padded to a multiple of 128 rows whose logits are
# left out), its initial weights saved with --init for `train-lm --init`, then trained on
# the token shard's windows in order, as `train-lm --shuffle off` takes them (context + 1
# tokens at stride context, batches of --batch-size, the last one of an epoch shorter),
# with AdamW (betas 0.9/0.95, weight decay on matrices and embeddings only), optim::CosineLR's
# warm-up and cosine schedule, gradient clipping and bf16 autocast. Every --eval-interval
# steps it prints "step S/N: train loss L" where L averages the losses of the steps
# train-lm averages in its line (those with step % 10 == 0, and the interval's last).
#   python3 bench/gpt2_curve_torch.py --data train.bin --init init.safetensors [--steps 300 ...]
# then on the same machine:
#   normcore train-lm --model gpt2 --data train.bin --val-data val.bin --init init.safetensors
#     --shuffle off --steps 300 --eval-interval 50 --precision bf16 [the same options]
import argparse, math, os, sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_train_torch import GPT, lr_at  # noqa: E402


def read_shard(path, vocab):  # llm.c's format: 256 int32 header, then uint16 ids
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not an llm.c token shard"
    tokens = np.fromfile(path, dtype=np.uint16, offset=1024)
    assert len(tokens) == header[2], f"{path}: {len(tokens)} tokens, the header says {header[2]}"
    assert tokens.max() < vocab, f"{path}: id {tokens.max()} past the vocabulary {vocab}"
    return torch.from_numpy(tokens.astype(np.int64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--init", required=True, help="where to save the initial weights (safetensors)")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embed", type=int, default=768)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-interval", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    device = torch.device("cuda")
    padded = (a.vocab + 127) // 128 * 128
    model = GPT(padded, a.context, a.layers, a.heads, a.embed, 0.0, "layernorm").to(device)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, a.init)

    tokens = read_shard(a.data, a.vocab)
    count = (len(tokens) - a.context - 1) // a.context + 1 if len(tokens) > a.context else 0
    assert count > 0, f"{a.data}: no window of {a.context + 1} tokens"
    starts = torch.arange(count) * a.context
    batches = (count + a.batch_size - 1) // a.batch_size

    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = min(a.warmup, a.steps - 1)
    print(f"torch {torch.__version__} bf16: GPT {a.layers} layers, {a.heads} heads, embed {a.embed}, context "
          f"{a.context}, vocabulary {a.vocab} padded to {padded}; {count} windows, batch {a.batch_size}, "
          f"{a.steps} steps; initial weights in {a.init}", flush=True)
    losses = []
    for step in range(a.steps):
        b = step % batches
        index = starts[b * a.batch_size:min((b + 1) * a.batch_size, count), None] + torch.arange(a.context + 1)
        window = tokens[index].to(device)
        x, y = window[:, :-1], window[:, 1:]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, a.lr, warmup, a.steps, a.min_lr)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)[..., :a.vocab]
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        interval_end = min(a.steps, (step // a.eval_interval + 1) * a.eval_interval)
        if step % 10 == 0 or step + 1 == interval_end:
            losses.append(loss.item())
        if step + 1 == interval_end:
            print(f"step {step + 1}/{a.steps}: train loss {sum(losses) / len(losses):.4f}", flush=True)
            losses = []


if __name__ == "__main__":
    main()
