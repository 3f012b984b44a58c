# PyTorch's side of the ONNX checks (bench/gpu_check.sh's onnxexport section): models exported
# with torch.onnx.export (the TorchScript exporter, opset 17, eval mode, constants folded) and
# their outputs computed by onnxruntime, in ONNX's backend-test layout, so that
# `normcore onnx-test DIR/checks` checks normcore's outputs against onnxruntime's:
#   DIR/checks/<model>/model.onnx, DIR/checks/<model>/test_data_set_0/input_0.pb, output_0.pb
# Models (random weights, BatchNorm statistics drawn away from 0 and 1): mlp (784-64-10, the
# CLI's Fashion-MNIST MLP shape, narrower), cnn (the CLI's cnn-bn at 8 and 16 channels),
# resnet18 and resnet50 (torchvision, batch 2 at 224 x 224), resnet50_b1 and resnet50_b64
# (the speed cases, their dims fixed), gpt (GPT-2 124M in ../shared/tools/gpt_peer.py's
# layout, tanh GELU, tied head, vocabulary 50304, batch 1 x 128 tokens).
# With --time, the speed cases go to DIR/speed/<case>/model.onnx (their batch fixed) and
# onnxruntime's median milliseconds on its CUDA (TF32 off and on; inputs and outputs bound on
# the GPU) and CPU (1 and 2 threads) execution providers are printed.
#   python3 bench/onnx_exports.py DIR [--time]
import argparse, math, os, statistics, time

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from onnx import numpy_helper

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("--time", action="store_true")
a = p.parse_args()


class Mlp(nn.Module):
    def __init__(s):
        super().__init__()
        s.fc1, s.fc2 = nn.Linear(784, 64), nn.Linear(64, 10)

    def forward(s, x):
        return s.fc2(F.relu(s.fc1(x.flatten(1))))


class Cnn(nn.Module):
    def __init__(s, c1=8, c2=16):
        super().__init__()
        layers = []
        for cin, cout in ((1, c1), (c1, c1)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        layers.append(nn.MaxPool2d(2))
        for cin, cout in ((c1, c2), (c2, c2)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c2 * 49, 32), nn.ReLU(), nn.Linear(32, 10)]
        s.net = nn.Sequential(*layers)

    def forward(s, x):
        return s.net(x)


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.qkv, s.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.ln2, s.fc, s.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(s, vocab=50304, context=1024, d=768, layers=12, heads=12):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        s.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        s.lnf = nn.LayerNorm(d)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        return F.linear(s.lnf(x), s.wte.weight)


def trained_like(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    return model.eval()


torch.manual_seed(0)
cases = {
    "mlp": (trained_like(Mlp()), torch.randn(8, 1, 28, 28)),
    "cnn": (trained_like(Cnn()), torch.randn(8, 1, 28, 28)),
    "resnet18": (trained_like(torchvision.models.resnet18()), torch.randn(2, 3, 224, 224)),
    "resnet50": (trained_like(torchvision.models.resnet50()), torch.randn(2, 3, 224, 224)),
    "gpt": (Gpt().eval(), torch.randint(0, 50304, (1, 128))),
}
for name, (model, x) in cases.items():
    folder = os.path.join(a.root, "checks", name)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    with torch.no_grad():
        want = model(x).numpy()
        torch.onnx.export(model, (x,), path, opset_version=17, input_names=["input"], output_names=["output"],
                          do_constant_folding=True, dynamo=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x.numpy()})[0]
    with open(os.path.join(folder, "test_data_set_0", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x.numpy(), "input").SerializeToString())
    with open(os.path.join(folder, "test_data_set_0", "output_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(got, "output").SerializeToString())
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    error = float(np.abs(got - want).max() / (1 + np.abs(want).max()))
    print(f"{name}: {os.path.getsize(path) / 1e6:.1f} MB, onnxruntime vs PyTorch {error:.1e}, ops {' '.join(ops)}")

if a.time:
    # The speed cases: ResNet-50 at batch 1 and 64, the GPT at 1 x 128; the model files of the
    # checks above re-exported with the batch fixed.
    speed = {"resnet50_b1": (cases["resnet50"][0], torch.randn(1, 3, 224, 224)),
             "resnet50_b64": (cases["resnet50"][0], torch.randn(64, 3, 224, 224)),
             "gpt": (cases["gpt"][0], cases["gpt"][1])}
    for name, (model, x) in speed.items():
        path = os.path.join(a.root, "speed", name, "model.onnx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with torch.no_grad():
            torch.onnx.export(model, (x,), path, opset_version=17, input_names=["input"],
                              output_names=["output"], do_constant_folding=True, dynamo=False)
        feed = {"input": x.numpy()}
        runs = [("CUDAExecutionProvider", 0, tf32) for tf32 in (0, 1)]
        if name != "resnet50_b64":  # minutes a run on two cores
            runs += [("CPUExecutionProvider", threads, 0) for threads in (1, 2)]
        for provider, threads, tf32 in runs:
            options = ort.SessionOptions()
            if threads:
                options.intra_op_num_threads = threads
                options.inter_op_num_threads = 1
            providers = [(provider, {"use_tf32": tf32})] if threads == 0 else [provider]
            session = ort.InferenceSession(path, options, providers=providers)
            if provider != session.get_providers()[0]:
                print(f"{name}: onnxruntime has no {provider}")
                continue
            if threads == 0:
                # Inputs and outputs stay on the GPU, as normcore's onnx-run keeps them.
                binding = session.io_binding()
                device_input = ort.OrtValue.ortvalue_from_numpy(feed["input"], "cuda", 0)
                binding.bind_ortvalue_input("input", device_input)
                binding.bind_output("output", "cuda")
                run = lambda: session.run_with_iobinding(binding)
            else:
                run = lambda: session.run(None, feed)
            reps = 50 if threads == 0 else 5
            for _ in range(3):
                run()
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                run()
                times.append((time.perf_counter() - start) * 1e3)
            where = f"cuda, use_tf32={tf32}" if threads == 0 else f"cpu, {threads} thread{'s' if threads > 1 else ''}"
            print(f"onnxruntime {ort.__version__} {name} on {where}: median {statistics.median(times):.3f} ms "
                  f"(fastest {min(times):.3f}) of {reps}")
