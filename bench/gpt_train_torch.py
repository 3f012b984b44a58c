# PyTorch peer of `normcore train-lm`: the same byte-level GPT (module names and layout, the
# head tied to tok_emb, GPT-2's initialization), the same fortunes files and fixed split,
# the same batch sampling scheme (uniform random windows of the train stream; not the same
# draws), AdamW (betas 0.9/0.95, weight decay on matrices and embeddings only) with the same
# warm-up + cosine schedule, clipping and step count, and the same validation windows. Prints
# the validation loss at the same intervals and the training tokens/s of each interval (the
# evaluation is not timed). --compile runs the model through torch.compile. --precision as
# normcore's: fp32 (TF32 off, the default), tf32, bf16 or fp16 (torch.autocast around the
# forward and loss; fp16 with a GradScaler). No network is needed; the corpus is read from --data (a
# folder of fortune files or one file; copy /usr/share/games/fortunes to the GPU machine).
#   python3 bench/gpt_train_torch.py --data DIR [--compile] [--steps N] [--device cuda|cpu] [...]
import argparse, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- data (models/text.cpp)
def fortune_files(path):
    if not os.path.isdir(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if "." not in n)
    return [os.path.join(path, n) for n in names
            if not os.path.islink(os.path.join(path, n)) and os.path.isfile(os.path.join(path, n))]


def split_fortunes(data):
    fortunes, current = [], b""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # the empty piece after the last newline is not a line
    for line in lines:
        if line == b"%":
            if current.strip(b" \t\r\n"):
                fortunes.append(current)
            current = b""
        else:
            current += line + b"\n"
    if current.strip(b" \t\r\n"):
        fortunes.append(current)
    return fortunes


def load_fortunes(path):
    train, validation, number = [], [], 0
    for f in fortune_files(path):
        with open(f, "rb") as handle:
            for fortune in split_fortunes(handle.read()):
                (validation if number % 10 == 9 else train).append(fortune + b"%\n")
                number += 1
    return b"".join(train), b"".join(validation), len(train), len(validation)


def windows(stream, offsets, context, device):
    index = offsets[:, None] + torch.arange(context + 1)
    w = stream[index].long().to(device, non_blocking=True)
    return w[:, :-1], w[:, 1:]


def spaced_offsets(size, count, context):
    last = size - context - 1
    return torch.tensor([0 if count == 1 else i * last // (count - 1) for i in range(count)])


# ---------------------------------------------------------------- model (models/gpt.cpp)
class CausalSelfAttention(nn.Module):
    def __init__(self, embed, heads, bias, dropout):
        super().__init__()
        self.qkv = nn.Linear(embed, 3 * embed, bias=bias)
        self.proj = nn.Linear(embed, embed, bias=bias)
        self.heads, self.dropout = heads, dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, embed, bias, dropout):
        super().__init__()
        self.fc = nn.Linear(embed, 4 * embed, bias=bias)
        self.proj = nn.Linear(4 * embed, embed, bias=bias)
        self.dropout = dropout

    def forward(self, x):
        return F.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")), self.dropout, self.training)


def make_norm(norm, embed, bias):
    return nn.LayerNorm(embed, eps=1e-5, bias=bias) if norm == "layernorm" else nn.RMSNorm(embed, eps=1e-6)


class Block(nn.Module):
    def __init__(self, embed, heads, norm, bias, dropout):
        super().__init__()
        self.norm1 = make_norm(norm, embed, bias)
        self.attn = CausalSelfAttention(embed, heads, bias, dropout)
        self.norm2 = make_norm(norm, embed, bias)
        self.mlp = MLP(embed, bias, dropout)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, embed, dropout, norm, bias=True):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, embed)
        self.pos_emb = nn.Embedding(context, embed)
        self.blocks = nn.ModuleList(Block(embed, heads, norm, bias, dropout) for _ in range(layers))
        self.norm_f = make_norm(norm, embed, bias)
        self.dropout = dropout
        residual_std = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                    p.normal_(0.0, residual_std)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = F.dropout(self.tok_emb(tokens) + self.pos_emb(positions), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm_f(x), self.tok_emb.weight)


def lr_at(s, base, warmup, total, min_lr):  # optim::CosineLR
    if s < warmup:
        return base * s / warmup
    if s > total:
        return min_lr
    return min_lr + (base - min_lr) * 0.5 * (1.0 + math.cos(math.pi * (s - warmup) / (total - warmup)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--embed", type=int, default=384)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--norm", default="layernorm", choices=["layernorm", "rmsnorm"])
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    lower = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)

    train, validation, n_train, n_validation = load_fortunes(a.data)
    train_stream = torch.frombuffer(bytearray(train), dtype=torch.uint8)
    validation_stream = torch.frombuffer(bytearray(validation), dtype=torch.uint8)
    model = GPT(256, a.context, a.layers, a.heads, a.embed, a.dropout, a.norm).to(device)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    run = torch.compile(model) if a.compile else model
    scaler = torch.amp.GradScaler(device.type) if a.precision == "fp16" else None
    print(f"torch {torch.__version__} {'compiled' if a.compile else 'eager'} {a.precision}: GPT {a.layers} layers, {a.heads} heads, "
          f"embed {a.embed}, context {a.context}, {a.norm}, dropout {a.dropout} ({params} parameters) on {device}")
    print(f"data: {n_train} train fortunes ({len(train)} bytes), {n_validation} validation fortunes "
          f"({len(validation)} bytes); batch {a.batch_size} x {a.context} bytes, {a.steps} steps, lr {a.lr}", flush=True)

    eval_windows = windows(validation_stream,
                           spaced_offsets(len(validation), a.eval_batches * a.batch_size, a.context), a.context, device)
    generator = torch.Generator().manual_seed(a.seed)

    def evaluate():
        model.eval()
        total = 0.0
        with torch.no_grad():
            for first in range(0, eval_windows[0].shape[0], a.batch_size):
                x, y = eval_windows[0][first:first + a.batch_size], eval_windows[1][first:first + a.batch_size]
                total += F.cross_entropy(run(x).view(-1, 256), y.reshape(-1)).item() * x.shape[0]
        model.train()
        return total / eval_windows[0].shape[0]

    rates = []
    step = 0
    while step < a.steps:
        end = min(a.steps, (step // a.eval_interval + 1) * a.eval_interval)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start, tokens, loss_sum, loss_count = time.perf_counter(), 0, 0.0, 0
        for step in range(step, end):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, a.lr, a.warmup, a.steps, a.min_lr)
            offsets = torch.randint(0, len(train) - a.context, (a.batch_size,), generator=generator)
            x, y = windows(train_stream, offsets, a.context, device)
            with torch.autocast(device.type, dtype=lower or torch.bfloat16, enabled=lower is not None):
                loss = F.cross_entropy(run(x).view(-1, 256), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            tokens += x.numel()
            if step % 10 == 0 or step + 1 == end:
                loss_sum += loss.item()
                loss_count += 1
        step = end
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        rates.append(tokens / seconds)
        print(f"step {step}/{a.steps}: train loss {loss_sum / max(loss_count, 1):.4f}, validation loss {evaluate():.4f} "
              f"({seconds:.1f} s, {tokens / seconds:.0f} tokens/s)", flush=True)
    steady = sorted(rates[1:] or rates)
    print(f"median tokens/s over the intervals after the first: {steady[len(steady) // 2]:.0f}")


if __name__ == "__main__":
    main()
