"""Environment fingerprint: which GPU and software stack a plan was measured on."""

from __future__ import annotations

import platform
from typing import Any

import torch

__all__ = ["environment_fingerprint", "environment_differences"]


def environment_fingerprint(device: str | torch.device | None = None) -> dict[str, Any]:
    """GPU name, compute capability and torch / triton / CUDA / Python versions of this process."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - triton is a dependency, but keep plans loadable without it
        triton_version = None
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": "cpu",
        "gpu_name": None,
        "compute_capability": None,
    }
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        index = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
        info["device"] = "cuda"
        info["gpu_name"] = torch.cuda.get_device_name(index)
        info["compute_capability"] = list(torch.cuda.get_device_capability(index))
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def environment_differences(recorded: dict[str, Any], current: dict[str, Any] | None = None) -> list[str]:
    """Human-readable differences that matter for kernels measured under `recorded` (empty = same stack)."""
    current = current if current is not None else environment_fingerprint(recorded.get("device"))
    diffs = []
    for key in ("device", "gpu_name", "compute_capability", "torch", "triton", "cuda"):
        if recorded.get(key) != current.get(key):
            diffs.append(f"{key}: plan has {recorded.get(key)!r}, this machine has {current.get(key)!r}")
    return diffs
