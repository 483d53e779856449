"""ResNet-50 with the CIFAR stem, in PyTorch: the same network the CUDA trainer builds.

3x3 stride-1 stem conv (3 -> 64) + BN + ReLU and no max-pool; bottleneck stages [3, 4, 6, 3] with
widths 64/128/256/512 and 4x expansion; stride 2 in the first block of stages 2-4, on the 3x3 conv
as torchvision's Bottleneck does; a 1x1 conv + BN projection shortcut where the shape changes;
global average pool; linear 2048 -> classes. 23,520,842 parameters for 10 classes.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the PyTorch model of the PyTorch reference), not a program: "
          "run python3 bench/pytorch_reference.py", file=sys.stderr)
    sys.exit(2)

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet50Cifar(nn.Module):
    def __init__(self, num_classes: int = 10, zero_init_residual: bool = False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True))
        blocks, in_ch = [], 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(in_ch, width, stride))
                in_ch = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        # torchvision's initialisation, so both trainers start from the same kind of weights.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # bin/train --zero-init-residual (torchvision's zero_init_residual, Goyal et al. 2017): each
        # block's last BN scale 0, so that every block starts as its shortcut.
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))
