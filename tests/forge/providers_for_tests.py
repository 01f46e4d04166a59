"""Real providers used by the optimizer, plan and runtime tests (registered under test-only type names)."""

from __future__ import annotations

import time
from typing import Any

import torch

from forge.functional import original_function
from forge.modules import ModuleKernelProvider, _key_from_repr
from forge.provider import KernelProvider
from forge.samples import Sample


class _FunctionProvider(KernelProvider):
    function_name = "gelu"

    def __init__(self, function_name: str | None = None) -> None:
        super().__init__()
        if function_name is not None:
            self.function_name = function_name
        self.calls = 0

    @property
    def supported_function(self) -> str:
        return self.function_name

    def _prepare(self, samples: list[Sample]) -> bool:
        return True

    def _to_dict(self) -> dict[str, Any]:
        return {"function_name": self.function_name}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> KernelProvider:
        return cls(state["function_name"])


class FastGeluProvider(_FunctionProvider, type_name="test_fast_gelu"):
    """Exact gelu through torch.erf: one fused-ish path, much cheaper than the slowed baseline below."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        self.calls += 1
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))


class SlowGeluProvider(_FunctionProvider, type_name="test_slow_gelu"):
    """Correct but slow: sleeps before computing."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        self.calls += 1
        time.sleep(0.002)
        return original_function("gelu")(x, approximate=approximate)


class WrongGeluProvider(_FunctionProvider, type_name="test_wrong_gelu"):
    """Fast but wrong (relu is not gelu)."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        self.calls += 1
        return torch.relu(x)


class RaisingGeluProvider(_FunctionProvider, type_name="test_raising_gelu"):
    """Raises on every call."""

    def _call(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("kernel exploded")


class DoublingReluProvider(_FunctionProvider, type_name="test_marker_relu"):
    """Marks its use: returns relu(x) computed exactly, counting calls (for runtime dispatch tests)."""

    function_name = "relu"

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        return torch.clamp_min(x, 0)


class SiluBySigmoidProvider(_FunctionProvider, type_name="test_silu_by_sigmoid"):
    """silu as x * sigmoid(x), counting calls (a plan for the Hugging Face Llama's MLP activation)."""

    function_name = "silu"

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        return x * torch.sigmoid(x)


class KeyedModuleKernel(ModuleKernelProvider):
    """Base of the tests' module kernels: saved as its target class and the instance keys it serves."""

    def _to_dict(self) -> dict[str, Any]:
        return {"target_class": self.target_class, "instance_keys": [repr(k) for k in self.instance_keys]}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> KeyedModuleKernel:
        provider = cls(state["target_class"])
        provider.instance_keys = frozenset(_key_from_repr(k) for k in state["instance_keys"])
        return provider
