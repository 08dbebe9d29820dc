"""ResNet-18, written out (torchvision has no CPU build matching our torch): the architecture of
``torchvision.models.resnet18`` (BasicBlock, layers [2, 2, 2, 2], widths 64-128-256-512,
Kaiming-initialised convolutions, batch-norm weight 1 and bias 0), random init.

Adapted to the data as is usual for small images: the stem's first conv takes the data's
channels, and for images of at most 64 px it is a 3x3 stride-1 conv with no max-pool (the
ImageNet stem, 7x7 stride 2 + max-pool, would shrink a 32x32 image to 8x8 before the first
block); larger images keep the ImageNet stem. The head is a linear layer to the outputs.
Torch only: shipped inside the registered model.
"""

from __future__ import annotations

import torch
from torch import nn

#: Images no larger than this (height and width) get the small-image stem.
SMALL_IMAGE = 64
WIDTHS = (64, 128, 256, 512)
BLOCKS = (2, 2, 2, 2)


class BasicBlock(nn.Module):
    """Two 3x3 convs with batch norm; a 1x1 projection when the shape changes."""

    expansion = 1

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 for images of ``input_shape`` (C, H, W) and ``num_outputs`` outputs."""

    def __init__(self, input_shape: list[int], num_outputs: int):
        super().__init__()
        channels, height, width = (int(d) for d in input_shape)
        self.input_shape = (channels, height, width)
        if max(height, width) <= SMALL_IMAGE:
            self.conv1 = nn.Conv2d(channels, WIDTHS[0], 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(channels, WIDTHS[0], 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(WIDTHS[0])
        self.relu = nn.ReLU(inplace=True)
        layers, in_ch = [], WIDTHS[0]
        for i, (out_ch, blocks) in enumerate(zip(WIDTHS, BLOCKS, strict=True)):
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(in_ch, out_ch, stride)]
            layer += [BasicBlock(out_ch, out_ch) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*layer))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(WIDTHS[-1], num_outputs)
        for module in self.modules():  # torchvision's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *self.input_shape)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
