# transformers' side of the Hugging Face GPT-2 check (bench/gpu_check.sh's hfgpt2 section).
#   python3 bench/hf_gpt2_reference.py make DIR
#     saves a randomly initialized GPT2LMHeadModel (several sizes, f32) with save_pretrained into
#     DIR/<name>/, and DIR/<name>/reference.safetensors with tokens [2, T], their logits and a
#     greedy continuation of 50 tokens from the first row's first 8 tokens, for the test
#     HfGpt2.MatchesTransformers (NORMCORE_HF_GPT2_DIR=DIR) to compare normcore against;
#   python3 bench/hf_gpt2_reference.py fixture DIR
#     the same for one small model (2 layers, 2 heads, width 32, context 32, the 256 byte
#     values as vocabulary) with every parameter drawn at random, LayerNorm weights and all
#     biases included, so that a misplaced one changes the logits: tests/data/hf_gpt2_tiny,
#     which the test suite checks without transformers (greedy continuation of 16 tokens);
#   python3 bench/hf_gpt2_reference.py check DIR
#     loads each DIR/<name>/resaved (written by that test with save_hf_gpt2) with
#     from_pretrained and compares its logits with the reference: normcore's files load back.
import os, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

SIZES = {  # name: (layers, heads, width, context, vocabulary)
    "tiny": (2, 2, 64, 64, 1000),
    "small": (4, 4, 128, 128, 50257),
    "gpt2-layout": (2, 12, 768, 1024, 50257),
}


def save_reference(model, out, vocab, context, new_tokens):
    model.save_pretrained(out, safe_serialization=True)
    tokens = torch.randint(0, vocab, (2, min(context, 48)))
    with torch.no_grad():
        logits = model(tokens).logits
        greedy = model.generate(tokens[:1, :8], max_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=0)[0, 8:]
    save_file({"tokens": tokens, "logits": logits.contiguous(), "greedy": greedy.contiguous()},
              os.path.join(out, "reference.safetensors"))
    print(f"{sum(p.numel() for p in model.parameters())} parameters saved to {out}")


def make(root):
    for name, (layers, heads, width, context, vocab) in SIZES.items():
        torch.manual_seed(0)
        config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=context, vocab_size=vocab)
        save_reference(GPT2LMHeadModel(config).eval(), os.path.join(root, name), vocab, context, 50)


def fixture(out):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=256)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".weight") and p.dim() == 1:  # LayerNorm weights around 1
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    save_reference(model, out, 256, 32, 16)


def check(root):
    worst = 0.0
    for name in SIZES:
        reference = load_file(os.path.join(root, name, "reference.safetensors"))
        model = GPT2LMHeadModel.from_pretrained(os.path.join(root, name, "resaved")).eval()
        with torch.no_grad():
            logits = model(reference["tokens"]).logits
        error = ((logits - reference["logits"]).norm() / reference["logits"].norm()).item()
        worst = max(worst, error)
        print(f"{name}: normcore's save_hf_gpt2 loaded by transformers, relative logits error {error:.2e}")
    print("PASS" if worst < 1e-5 else "FAIL")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    actions = {"make": make, "fixture": fixture, "check": check}
    sys.exit(actions[sys.argv[1]](sys.argv[2]))
