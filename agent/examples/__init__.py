"""Example kernel files shown verbatim in the prompts (`triton_example.py`, `module_example*.py`).

They are complete, correct files in the format the agent must produce; tests run them under the Triton
interpreter against PyTorch. Read them as text (`EXAMPLES_DIR / name`); importing them defines Triton kernels.
"""

from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent
