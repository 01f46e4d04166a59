"""The default (`llama`) demo under its original import path: `from forge.demo import demo_model, demo_inputs`.

The demos live in `forge.demos` (a registry of `llama` and `unet`); this module keeps older imports working.
"""

from forge.demos.llama import DemoConfig, DemoDecoder, demo_config, demo_inputs, demo_model

__all__ = ["DemoConfig", "DemoDecoder", "demo_config", "demo_inputs", "demo_model"]
