"""Test-wide setup: Triton kernels run on CPU tensors through the interpreter when there is no GPU."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
