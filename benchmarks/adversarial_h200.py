"""Run the adversarial corpus (tests/adversarial) on CUDA: one line per kernel and a summary.

WHY. On the CPU machine interpreted Triton is never faster than PyTorch, so an exploit that passes the oracle is
only "slower" there; on the H200 the same exploits were *selected* (issue 10: up to 1,600x) and returned garbage in
production. This runs every corpus file through the production path (screen -> sandbox -> import ->
`make_plan`'s in-process validation and timing) on the GPU, on model-like sizes (`--scale`: the CI shapes' rows
times 1024, so a kernel's own time and not its launch decides what is selected), with the benchmark shortened to
`--timing short` (3 warm-up passes, 10 rounds, 50 ms minimum) so the corpus fits in one device command.

Usage (from the repository root, on the GPU host):

    python benchmarks/adversarial_h200.py [--jobs 4] [--timing short] [--scale 1024] [--unsafe-sandbox] [NAME ...]

It prints `<ok|GAP|BAD> name expected actual [stage speedup; production ...] reason` per kernel (GAP: an exploit
not rejected as expected; BAD: an honest kernel rejected), then the summary, and writes a markdown table and the
raw outcomes to `$OUT/adversarial_h200.md` / `.json` when `$OUT` is set. `--unsafe-sandbox` sets
`KFORGE_UNSAFE_SANDBOX=1` for hosts without bubblewrap (the sandbox then runs without its boundary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.adversarial.corpus import entry  # noqa: E402
from tests.adversarial.harness import markdown_table, run_corpus, summary  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="corpus files (default: all)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--jobs", type=int, default=4, help="files checked at a time (they share the GPU)")
    parser.add_argument("--timing", default="short", choices=("quick", "short", "full"))
    parser.add_argument("--scale", type=int, default=1024,
                        help="multiply the samples' rows (1024: 8192 x 64 silu, 4096 x 1024 rms_norm)")
    parser.add_argument("--unsafe-sandbox", action="store_true", help="allow the sandbox without its boundary")
    args = parser.parse_args()
    if args.unsafe_sandbox:
        os.environ["KFORGE_UNSAFE_SANDBOX"] = "1"
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available here; pass --device cpu to run the corpus on the CPU", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"adversarial corpus on {device_name} (torch {torch.__version__}), timing {args.timing}, "
          f"rows x{args.scale}, {args.jobs} at a time", flush=True)
    chosen = [entry(n) for n in args.names] if args.names else None
    start = time.monotonic()
    outcomes = run_corpus(chosen, args.device, jobs=args.jobs, timing=args.timing, scale=args.scale,
                          on_result=lambda o: print(o.line(), flush=True))
    elapsed = time.monotonic() - start
    text = summary(outcomes)
    print(text)
    print(f"wall time {elapsed:.0f} s")
    out = os.environ.get("OUT")
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        header = (f"# Adversarial corpus on {device_name}\n\ntorch {torch.__version__}, timing `{args.timing}`, "
                  f"rows x{args.scale}, {elapsed:.0f} s.\n\n```\n{text}\n```\n\n")
        (folder / "adversarial_h200.md").write_text(header + markdown_table(outcomes) + "\n")
        (folder / "adversarial_h200.json").write_text(json.dumps([o.to_dict() for o in outcomes], indent=1))
        print(f"wrote {folder / 'adversarial_h200.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
