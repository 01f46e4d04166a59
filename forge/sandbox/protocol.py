"""File layout of a sandbox run folder, shared by the parent (`runner`) and the child (`child`).

Every file here is written by the parent: before the child starts (the child sees the folder read-only inside the
boundary), or, for a kept folder, the tails of the child's output (stdout, stderr) after it ended. There is no result
file: the verdict is computed in the parent (`forge.sandbox.harness`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge import atomic

__all__ = ["CANDIDATE_STEM", "INPUTS_FILE", "JOB_FILE", "MODULE_NAME", "STDERR_FILE", "STDOUT_FILE", "read_json",
           "write_json_atomic"]

CANDIDATE_STEM = "kernel"          # + the language's file suffix
MODULE_NAME = "kforge_candidate"   # module name the candidate is imported under
JOB_FILE = "job.json"              # settings for the child (JSON)
INPUTS_FILE = "inputs.pt"          # samples and KernelUtils (torch.save)
STDOUT_FILE = "stdout.txt"  # the tails of the child's output, written when the run folder is kept
STDERR_FILE = "stderr.txt"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (`forge.atomic`: unique temporary, fsync, rename; readers never see half a file)."""
    atomic.write_json_atomic(path, data, default=str)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} does not hold a JSON object")
    return data
