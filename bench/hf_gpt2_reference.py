# transformers' side of the Hugging Face GPT-2 check (bench/gpu_check.sh's hfgpt2 section).
#   python3 bench/hf_gpt2_reference.py make DIR
#     saves a randomly initialized GPT2LMHeadModel (several sizes, f32) with save_pretrained into
#     DIR/<name>/, and DIR/<name>/reference.safetensors with tokens [2, T], their logits and a
#     greedy continuation of 50 tokens from the first row's first 8 tokens, for the test
#     HfGpt2.MatchesTransformers (NORMCORE_HF_GPT2_DIR=DIR) to compare normcore against;
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


def make(root):
    for name, (layers, heads, width, context, vocab) in SIZES.items():
        torch.manual_seed(0)
        config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=context, vocab_size=vocab)
        model = GPT2LMHeadModel(config).eval()
        out = os.path.join(root, name)
        model.save_pretrained(out, safe_serialization=True)
        tokens = torch.randint(0, vocab, (2, min(context, 48)))
        with torch.no_grad():
            logits = model(tokens).logits
            greedy = model.generate(tokens[:1, :8], max_new_tokens=50, do_sample=False,
                                    pad_token_id=0)[0, 8:]
        save_file({"tokens": tokens, "logits": logits.contiguous(), "greedy": greedy.contiguous()},
                  os.path.join(out, "reference.safetensors"))
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters saved to {out}")


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
    sys.exit(make(sys.argv[2]) if sys.argv[1] == "make" else check(sys.argv[2]))
