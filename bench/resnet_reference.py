# torchvision's side of the ResNet check (bench/gpu_check.sh's resnet section).
#   python3 bench/resnet_reference.py DIR
# For resnet18, resnet34, resnet50 and resnet101 with random weights (batch statistics drawn
# away from 0 and 1, so that eval mode uses them), writes DIR/<name>.safetensors (the
# state_dict, f32) and DIR/<name>.reference.safetensors (images [2, 3, 160, 128] and
# torchvision's eval-mode logits) for the test ResNetReference.MatchesTorchvision
# (NORMCORE_RESNET_DIR=DIR).
import os, sys

import torch
import torchvision
from safetensors.torch import save_file

root = sys.argv[1]
os.makedirs(root, exist_ok=True)
for name in ("resnet18", "resnet34", "resnet50", "resnet101"):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=1000).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
        images = torch.randn(2, 3, 160, 128)
        logits = model(images)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(root, f"{name}.safetensors"))
    save_file({"images": images, "logits": logits.contiguous()}, os.path.join(root, f"{name}.reference.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}")
