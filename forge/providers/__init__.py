"""Static kernel providers that ship with kernel-forge."""

from forge.modules import CompiledModuleProvider
from forge.providers.compiled_function import CompiledFunctionProvider
from forge.providers.defaults import default_providers
from forge.providers.graphed_module import GraphedModuleProvider
from forge.providers.libraries import LibraryKernelProvider, LibraryUnavailable, library_providers
from forge.providers.patch_conv import PatchConvProvider
from forge.providers.torch_sdpa import SDPA_BACKENDS, TorchSDPAProvider, default_sdpa_backends, sdpa_backend_names

__all__ = [
    "SDPA_BACKENDS",
    "CompiledFunctionProvider",
    "CompiledModuleProvider",
    "GraphedModuleProvider",
    "LibraryKernelProvider",
    "LibraryUnavailable",
    "PatchConvProvider",
    "TorchSDPAProvider",
    "default_providers",
    "default_sdpa_backends",
    "library_providers",
    "sdpa_backend_names",
]
