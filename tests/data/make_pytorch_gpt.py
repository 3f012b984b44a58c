# Makes tests/data/pytorch_gpt.safetensors: the state_dict of bench/gpt_train_torch.py's GPT
# (the PyTorch module laid out like normcore's models::GPT: 2 layers, 2 heads, embed 32,
# context 16, LayerNorm, biases), saved with safetensors, plus a batch of tokens and the
# logits PyTorch computes for it in eval mode ("io.tokens", "io.logits"). The test loads
# the state_dict into normcore's GPT and must reproduce the logits. Run where PyTorch and
# safetensors exist:
#   python3 tests/data/make_pytorch_gpt.py OUT.safetensors
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from gpt_train_torch import GPT  # noqa: E402

torch.manual_seed(1234)
model = GPT(vocab=256, context=16, layers=2, heads=2, embed=32, dropout=0.0, norm="layernorm").eval()
tokens = torch.randint(0, 256, (2, 16))
with torch.no_grad():
    logits = model(tokens)
tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
tensors["io.tokens"] = tokens
tensors["io.logits"] = logits
save_file(tensors, sys.argv[1], metadata={"made_by": f"torch {torch.__version__}"})
print("wrote", sys.argv[1], "keys", sorted(tensors))
