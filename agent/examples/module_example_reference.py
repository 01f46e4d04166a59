"""Example reference problem (KernelBench format): a scaled leaky ReLU with a learned per-feature scale."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features: int, negative_slope: float):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x * self.scale, self.negative_slope)


batch_size = 16
features = 256


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, 0.1]
