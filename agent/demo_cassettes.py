"""Cassettes shipped with the embedded demos, so `kforge optimize --demo` runs the whole agent path with no key.

Each file under `agent/cassettes/` holds first-turn requests of the LLM generator for one demo as rendered on one
device, in one kernel language (`demo-<name>-<device>.jsonl` for Triton, `demo-<name>-<device>-<language>.jsonl`
for another language such as `cuda`; device `cpu` or the GPU's name in lower case with spaces as dashes, e.g.
`nvidia-h200`) and the replies a stand-in model wrote for them (a separate session given only the rendered
request, with no tools). Replay keys on the exact request, so a cassette serves only the device it was rendered on;
the demo then picks it by the same rule.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["DemoCassette", "demo_cassette", "device_slug"]

CASSETTE_DIR = Path(__file__).resolve().parent / "cassettes"
# The language the first cassettes were recorded in: its file names carry no language suffix (a naming rule of the
# shipped files, not a default: callers always name the language).
_UNSUFFIXED_LANGUAGE = "triton"


def device_slug(device: str | torch.device) -> str:
    """`cpu`, or the CUDA device's name as a file-name slug (`NVIDIA H200` -> `nvidia-h200`)."""
    target = torch.device(device)
    if target.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    index = target.index if target.index is not None else torch.cuda.current_device()
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(index).lower()).strip("-")


@dataclass(frozen=True)
class DemoCassette:
    """A shipped cassette: its path, the model name its requests carry and the functions it has replies for."""

    path: Path
    model: str
    functions: tuple[str, ...]


def demo_cassette(demo: str, device: str | torch.device, folder: Path = CASSETTE_DIR, *,
                  language: str) -> DemoCassette | None:
    """The cassette shipped for `demo` on `device` in `language` (a registered language's name), or None when there
    is none for them."""
    suffix = "" if language == _UNSUFFIXED_LANGUAGE else f"-{language}"
    path = folder / f"demo-{demo}-{device_slug(device)}{suffix}.jsonl"
    if not path.is_file():
        return None
    model, functions = None, []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            entry = json.loads(line)
            model = model or entry["request"]["model"]
            tag = entry.get("tag")
            if tag and tag not in functions:
                functions.append(tag)
    if model is None:
        return None
    return DemoCassette(path=path, model=model, functions=tuple(functions))
