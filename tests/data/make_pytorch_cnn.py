# Weights of normcore's "cnn-bn" layout exchanged with PyTorch, both ways, with no package
# beyond PyTorch (safetensors files are read and written here directly).
#
#   python3 tests/data/make_pytorch_cnn.py make OUT.safetensors DATA_DIR
# trains PyTorch's nn.Sequential of the cnn-bn layers for one epoch on Fashion-MNIST (so the
# BatchNorm running statistics are real ones), rounds the weights to f16 (a small file), and
# saves its state_dict with 8 test images ("io.x") and the logits PyTorch computes for them
# in evaluation mode from the rounded weights ("io.logits"). tests/conformance/test_interop.cpp loads it
# into normcore's model and must reproduce the logits.
#
#   python3 tests/data/make_pytorch_cnn.py load CHECKPOINT DATA_DIR [MODEL]
# loads a normcore checkpoint of cnn-bn or cnn-gn (MODEL, default cnn-bn) into PyTorch and
# prints its test accuracy there.
import gzip, json, struct, sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def cnn(name):
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


def save(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        buf = bytearray(raw[8 + n + begin:8 + n + end])
        t = torch.frombuffer(buf, dtype=DTYPES[e["dtype"]]) if buf else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def fashion_mnist(folder, prefix):
    def idx(name):
        raw = gzip.open(f"{folder}/{name}", "rb").read()
        n = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(n)]
        return torch.frombuffer(bytearray(raw[4 + 4 * n:]), dtype=torch.uint8).reshape(dims)

    images = idx(f"{prefix}-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530).unsqueeze(1)
    return images, idx(f"{prefix}-labels-idx1-ubyte.gz").long()


def make(out, folder):
    torch.manual_seed(1234)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = cnn("cnn-bn").to(dev)
    x, y = fashion_mnist(folder, "train")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    perm = torch.randperm(len(y))
    for s in range(0, len(y), 128):
        i = perm[s:s + 128]
        loss = F.cross_entropy(model(x[i].to(dev)), y[i].to(dev), label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model = model.cpu().eval()
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    xt, yt = fashion_mnist(folder, "t10k")
    with torch.no_grad():
        accuracy = (model(xt).argmax(1) == yt).float().mean().item()
        io_x = xt[:8].clone()
        logits = model(io_x)
    tensors = {k: (v.half() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    tensors["io.x"] = io_x
    tensors["io.logits"] = logits
    save(out, tensors, {"made_by": f"torch {torch.__version__}", "test_accuracy": f"{accuracy:.4f}"})
    print(f"wrote {out}: {len(tensors)} tensors, PyTorch cnn-bn after one epoch: test accuracy {100 * accuracy:.2f}%")


def load_checkpoint(path, folder, name):
    state = load(path)
    model = cnn(name).eval()
    model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    x, y = fashion_mnist(folder, "t10k")
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"normcore checkpoint {path} ({name}) evaluated by PyTorch: test accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "load":
        load_checkpoint(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "cnn-bn")
    else:
        sys.exit(__doc__ or "usage: make_pytorch_cnn.py make OUT DATA | load CHECKPOINT DATA [MODEL]")
