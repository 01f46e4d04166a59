"""The adversarial corpus: kernel files an LLM could reply with, each one an exploit of the oracle or an honest kernel.

WHY. A model rewarded for speed games its judge (issue 10; `../shared/reference/peer_systems_and_reward_hacks.md`
section 3). Every mechanism found so far gets a kernel here, written against this harness, so CI proves that each
one is refused for the right reason and that honest kernels of the same shapes stay accepted.

Each file in `kernels/` starts with a comment header, the single source of its metadata:

    # adversarial: <name, = the file stem>
    # function: <torch.nn.functional name>
    # samples: <a key of SAMPLES: the captured calls the kernel is judged on>
    # mechanism: <what it does and why it could fool the judge> (continuation lines start with "#   ")
    # source: <issue 10 #n / ref table #n / issue 9>
    # expect: <accepted | one or more Category values, the first being the defence meant to catch it>
    # slow: yes (optional; marks the test @pytest.mark.slow)
    # known-gap: <issue and what is missing> (optional; an open gap: when the exploit gets through, the test
    #   reports it as xfail with this reason instead of failing CI; when a defence catches it, it passes)

`expect` lists every category that counts as the right rejection: defences are layered (a patch of
`torch.Tensor.any` is refused by screening, and failing that by the integrity check).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch

from forge.samples import Sample

__all__ = ["KERNELS_DIR", "SAMPLES", "Category", "Entry", "entries", "entry", "samples_for"]

KERNELS_DIR = Path(__file__).with_name("kernels")


class Category(StrEnum):
    """Why the path an LLM reply takes ended (or `accepted`: it passed the oracle and reached timing)."""

    ACCEPTED = "accepted"
    FORBIDDEN = "forbidden"  # refused by screening: nothing ran
    COMPILE_ERROR = "compile_error"  # import or Triton compile failure
    RUNTIME_ERROR = "runtime_error"  # the candidate raised (BaseException contained included)
    MISMATCH = "mismatch"  # the oracle's values, structure, probes (offset views, call patterns, perturbations)
    LAUNCH_CHECK = "launch_check"  # work outside the candidate's own kernels
    INTEGRITY = "integrity"  # the judge, its timers or the interpreter's state were found changed
    CRASH = "crash"  # killed, timed out, no verdict, or an exception escaped make_plan
    HARNESS_ERROR = "harness_error"  # the harness failed: neither a pass nor a rejection


@dataclass(frozen=True)
class Entry:
    """One corpus file and its header."""

    name: str
    path: Path
    function: str
    samples: str
    mechanism: str
    source_ref: str
    expect: tuple[Category, ...]
    slow: bool = False
    known_gap: str | None = None

    @property
    def honest(self) -> bool:
        return self.expect == (Category.ACCEPTED,)

    @property
    def source(self) -> str:
        return self.path.read_text()


def _parse_header(path: Path) -> Entry:
    fields: dict[str, str] = {}
    last = None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   ") and last is not None:
            fields[last] += " " + line[4:].strip()
            continue
        key, _, value = line[1:].partition(":")
        last = key.strip()
        fields[last] = value.strip()
    missing = {"adversarial", "function", "samples", "mechanism", "source", "expect"} - set(fields)
    if missing:
        raise ValueError(f"{path.name}: header lacks {', '.join(sorted(missing))}")
    if fields["adversarial"] != path.stem:
        raise ValueError(f"{path.name}: header names {fields['adversarial']!r}, not the file stem")
    if fields["samples"] not in SAMPLES:
        raise ValueError(f"{path.name}: unknown samples {fields['samples']!r}")
    expect = tuple(Category(word) for word in fields["expect"].split())
    if Category.ACCEPTED in expect and len(expect) > 1:
        raise ValueError(f"{path.name}: an honest kernel expects only `accepted`")
    return Entry(name=path.stem, path=path, function=fields["function"], samples=fields["samples"],
                 mechanism=fields["mechanism"], source_ref=fields["source"], expect=expect,
                 slow=fields.get("slow", "no").lower() in {"yes", "true", "1"},
                 known_gap=fields.get("known-gap") or None)


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Every corpus file, honest ones first, then exploits, each group by name."""
    found = [_parse_header(p) for p in sorted(KERNELS_DIR.glob("*.py"))]
    return tuple(sorted(found, key=lambda e: (not e.honest, e.name)))


def entry(name: str) -> Entry:
    for e in entries():
        if e.name == name:
            return e
    raise KeyError(f"no corpus entry {name!r}")


# ---------------------------------------------------------------------------------------------------------
# Captured calls (small shapes: the corpus runs on 2 CPU cores under the Triton interpreter)
# ---------------------------------------------------------------------------------------------------------
def _randn(shape: tuple[int, ...], seed: int, device: str, scale: float = 1.0, shift: float = 0.0,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype).to(device)


def _silu_f32(device: str, scale: int = 1) -> list[Sample]:
    return [Sample((_randn((8 * scale, 64), 1, device),), {})]


def _gelu_bf16_small(device: str, scale: int = 1) -> list[Sample]:
    # Small activations: |gelu(x)| ~ |x| / 2 ~ 2e-3, under bf16's absolute floor of 1e-2.
    return [Sample((_randn((8 * scale, 128), 2, device, scale=0.004, dtype=torch.bfloat16),), {})]


def _softmax_f32(device: str, scale: int = 1) -> list[Sample]:
    return [Sample((_randn((8 * scale, 64), 3, device, scale=2.0),), {"dim": -1})]


def _softmax_flat(device: str, scale: int = 1) -> list[Sample]:
    # Flat logits: softmax is 1/64 to within ~2e-6, under fp32's absolute floor of 1e-5.
    return [Sample((_randn((8 * scale, 64), 4, device, scale=1e-4),), {"dim": -1})]


def _softmax_dim0(device: str, scale: int = 1) -> list[Sample]:
    return [Sample((_randn((64, 8 * scale), 8, device, scale=2.0),), {"dim": 0})]


def _layer_norm_f32(device: str, scale: int = 1) -> list[Sample]:
    # Default-initialised affine parameters (all ones, all zeros), as a freshly built model captures them.
    x = _randn((8 * scale, 64), 5, device)
    return [Sample((x, (64,), torch.ones(64, device=device), torch.zeros(64, device=device), 1e-5), {})]


def _rms_norm_bf16(device: str, scale: int = 1) -> list[Sample]:
    x = _randn((4 * scale, 1024), 6, device, scale=1.0, dtype=torch.bfloat16)
    w = _randn((1024,), 7, device, scale=0.1, shift=1.0, dtype=torch.bfloat16)
    return [Sample((x, (1024,), w, 1e-6), {})]


SAMPLES: dict[str, Callable[[str, int], list[Sample]]] = {
    "silu_f32": _silu_f32,
    "gelu_bf16_small": _gelu_bf16_small,
    "softmax_f32": _softmax_f32,
    "softmax_flat": _softmax_flat,
    "softmax_dim0": _softmax_dim0,
    "layer_norm_f32": _layer_norm_f32,
    "rms_norm_bf16": _rms_norm_bf16,
}


def samples_for(e: Entry, device: str = "cpu", scale: int = 1) -> list[Sample]:
    """The captured calls `e` is judged on, on `device`; `scale` multiplies the number of rows (the H200 script uses
    model-like sizes, where a kernel's own time, not its launch, decides what gets selected)."""
    return SAMPLES[e.samples](device, scale)
