"""File layout of a sandbox run folder, shared by the parent (`runner`) and the child (`child`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CANDIDATE_STEM", "HOME_DIR", "INPUTS_FILE", "JOB_FILE", "MODULE_NAME", "RESULT_FILE", "STDERR_FILE",
           "STDOUT_FILE", "TMP_DIR", "read_json", "write_json_atomic"]

CANDIDATE_STEM = "kernel"          # + the language's file suffix
MODULE_NAME = "kforge_candidate"   # module name the candidate is imported under
JOB_FILE = "job.json"              # settings for the child (JSON)
INPUTS_FILE = "inputs.pt"          # samples and KernelUtils (torch.save)
RESULT_FILE = "result.json"        # the child's verdict (JSON, written atomically)
STDOUT_FILE = "stdout.txt"
STDERR_FILE = "stderr.txt"
HOME_DIR = "home"
TMP_DIR = "tmp"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary sibling, then rename it into place (readers never see half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} does not hold a JSON object")
    return data
