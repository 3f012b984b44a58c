# The data-parallel peer of `normcore train-lm --model gpt2 --nproc N --benchmark`: PyTorch's
# GPT-2 124M training step (vocabulary 50304, context 1024, bf16 autocast, fused AdamW with
# weight decay 0.1, gradient clipping at 1.0) under torchrun, on every GPU of the job.
#   torchrun --nproc_per_node N bench/gpt_ddp_torch.py [--mode ddp|zero1|fsdp] [--compile]
# ddp: DistributedDataParallel; zero1: the same with ZeroRedundancyOptimizer (optimizer state
# sharded, ZeRO stage 1); fsdp: FullyShardedDataParallel over the blocks (parameters,
# gradients and optimizer state sharded; bf16 compute, f32 reduction).
# Rank 0 prints one line: the median step time, the job's tokens/s, and the largest peak of
# allocated memory over the ranks.
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["ddp", "zero1", "fsdp"], default="ddp")
ap.add_argument("--compile", action="store_true")
ap.add_argument("--batch", type=int, default=16, help="windows per rank")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
args = ap.parse_args()

V, T, L, D, H = 50304, 1024, 12, 768, 12


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b = x.shape[0]
        heads = self.qkv(self.norm1(x)).view(b, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(heads[0], heads[1], heads[2], is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, T, D))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(V, D), nn.Embedding(T, D)
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.norm = nn.LayerNorm(D)
        for name, p in self.named_parameters():  # GPT-2's initialization
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "norm" not in name:
                nn.init.normal_(p, std=0.02 / (2 * L) ** 0.5 if name.endswith(("proj.weight", "down.weight")) else 0.02)

    def forward(self, idx, targets):
        x = self.tokens(idx) + self.positions.weight
        for layer in self.layers:
            x = layer(x)
        logits = self.norm(x) @ self.tokens.weight.t()  # the head tied to the embedding
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def groups(module):  # weight decay on the matrices and embeddings, not on biases and norms
    named = list(module.named_parameters())
    decayed = [p for n, p in named if n.endswith("weight") and "norm" not in n]
    return decayed, [p for n, p in named if not (n.endswith("weight") and "norm" not in n)]


dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
model = Model().cuda()


adamw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
if args.mode == "fsdp":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Layer}), use_orig_params=True,
                   mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                   device_id=local)
    decay, rest = groups(wrapped)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], **adamw)
else:
    wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[local], gradient_as_bucket_view=True)
    decay, rest = groups(model)
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, weight_decay=0.1, **adamw)
        opt.add_param_group({"params": rest, "weight_decay": 0.0})
    else:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                **adamw)
step_model = torch.compile(wrapped) if args.compile else wrapped
g = torch.Generator(device="cuda").manual_seed(1 + rank)
tokens = torch.randint(0, 50257, (args.batch, T + 1), device="cuda", generator=g)
x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_model(x, y)
    loss.backward()
    if args.mode == "fsdp":
        wrapped.clip_grad_norm_(1.0)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


for _ in range(args.warmup):
    step()
torch.cuda.synchronize()
times = []
for _ in range(args.steps):
    start = time.perf_counter()
    loss = step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
times.sort()
ms = 1e3 * times[len(times) // 2]
peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**20], device="cuda")
dist.all_reduce(peak, op=dist.ReduceOp.MAX)
if rank == 0:
    name = args.mode + ("+compile" if args.compile else "")
    print(f"torch {name}: {world} ranks x B {args.batch} x T {T}: {ms:.2f} ms/step, "
          f"{world * args.batch * T / (ms / 1e3):,.0f} tokens/s, loss {loss.item():.4f}, "
          f"peak memory {peak.item():,.0f} MiB (the largest rank)", flush=True)
dist.destroy_process_group()
