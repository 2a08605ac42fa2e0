"""ResNet-18 and MobileNetV2 as torchvision defines them, at 1×3×224×224, random weights.

torchvision is no dependency of opforge or of the peers' venv, so the two architectures
are written here, layer for layer as in torchvision's ``resnet18()`` and
``mobilenet_v2()`` (same module order, kernel sizes, strides, paddings, channel counts,
``bias=False`` convolutions followed by BatchNorm, ReLU / ReLU6, dropout before the
classifier, 1000 classes). Parameters are seeded and then moved away from their defaults
by ``external_check.spread_parameters`` (the design note there says how and why):
BatchNorm statistics set from the data each layer sees and then moved, affine weights
U(0.5, 1.5) and biases U(-0.3, 0.3), so a runtime that misreads any of them changes the
logits while they stay of order 1, as a trained network's are. Eval mode.

These are the "realistic sizes" of the performance issue: ResNet-18 is 1.8 GFLOPs and
11.7M parameters, MobileNetV2 0.3 GFLOPs and 3.5M parameters (depthwise convolutions).
"""

from __future__ import annotations

import torch
from torch import nn

from external_check import spread_parameters

__all__ = ["resnet18", "mobilenet_v2", "IMAGE"]

IMAGE = (1, 3, 224, 224)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 1)
        self.layer2 = self._layer(128, 2)
        self.layer3 = self._layer(256, 2)
        self.layer4 = self._layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        blocks = [BasicBlock(self.inplanes, planes, stride, downsample), BasicBlock(planes, planes)]
        self.inplanes = planes
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _conv_bn_relu6(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(cin * expand_ratio))
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(cin, hidden, kernel=1))
        layers += [_conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s), torchvision's table
    SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
               (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        cin = 32
        features: list[nn.Module] = [_conv_bn_relu6(3, cin, stride=2)]
        for t, c, n, s in self.SETTING:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn_relu6(cin, 1280, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def _build(cls: type[nn.Module]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = cls().eval()
    inputs = (torch.randn(IMAGE, generator=torch.Generator().manual_seed(0)),)
    spread_parameters(model, inputs)
    return model.eval(), inputs


def resnet18() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _build(ResNet18)


def mobilenet_v2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _build(MobileNetV2)
