"""LLM kernel generator: writes Triton kernels for one `torch.nn.functional` function, screens and tests them."""
