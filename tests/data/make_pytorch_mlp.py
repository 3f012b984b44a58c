# Makes tests/data/pytorch_mlp.safetensors: a PyTorch nn.Sequential laid out like normcore's
# "mlp" classifier, its state_dict saved with safetensors, plus an input batch and the
# logits PyTorch computes for it ("io.x", "io.logits"). The test loads the state_dict into
# normcore's model and must reproduce the logits. Run where PyTorch and safetensors exist:
#   python3 tests/data/make_pytorch_mlp.py OUT.safetensors
# With a normcore checkpoint and the Fashion-MNIST folder as further arguments, it also
# loads the checkpoint's model into PyTorch and prints its test accuracy there (the other
# direction of the exchange).
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 256),
                         nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 10))


torch.manual_seed(1234)
model = mlp().eval()
x = torch.randn(4, 1, 28, 28)
with torch.no_grad():
    logits = model(x)
tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
tensors["io.x"] = x
tensors["io.logits"] = logits
save_file(tensors, sys.argv[1], metadata={"made_by": f"torch {torch.__version__}"})
print("wrote", sys.argv[1], "keys", sorted(tensors))

if len(sys.argv) > 3:
    import gzip
    state = load_file(sys.argv[2])
    theirs = mlp().eval()
    theirs.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})

    def idx(name):
        raw = gzip.open(f"{sys.argv[3]}/{name}", "rb").read()
        n = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(n)]
        return torch.frombuffer(bytearray(raw[4 + 4 * n:]), dtype=torch.uint8).reshape(dims)

    images = idx("t10k-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530).unsqueeze(1)
    labels = idx("t10k-labels-idx1-ubyte.gz").long()
    with torch.no_grad():
        accuracy = (theirs(images).argmax(1) == labels).float().mean().item()
    print(f"normcore checkpoint {sys.argv[2]} evaluated by PyTorch: test accuracy {100 * accuracy:.2f}%")
