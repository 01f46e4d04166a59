"""The JSONL results store (append, resume, truncated last line), static sharding, and the output folder lock."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from evals import ResultsStore, load_suite, parse_shard, record_key, shard
from evals.results import LOCK_FILE, OutputFolderBusyError, OutputFolderLock


def test_append_and_load_round_trip(tmp_path):
    store = ResultsStore(tmp_path / "runs" / "results.jsonl")
    store.append({"problem_id": "a", "suite": "s", "correct": np.bool_(True), "latency_ms": np.float32(0.5),
                  "speedup_eager": math.nan, "attempts": np.int64(2), "failure_reason": None})
    store.append({"problem_id": "b", "suite": "s", "correct": False, "speedup_eager": math.inf})
    lines = store.path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    first, second = store.load()
    assert first == {"problem_id": "a", "suite": "s", "correct": True, "latency_ms": 0.5, "speedup_eager": None,
                     "attempts": 2, "failure_reason": None}
    assert second["speedup_eager"] is None
    frame = store.frame()
    assert frame["correct"].tolist() == [True, False] and "cost_usd" in frame.columns


def test_append_rejects_bad_records(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match="needs a 'problem_id'"):
        store.append({"suite": "s"})
    with pytest.raises(TypeError, match="record.blob has type object"):
        store.append({"problem_id": "a", "blob": object()})
    assert not store.path.exists() or store.path.read_text() == ""


def test_truncated_last_line_is_skipped_then_repaired(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    path.write_text('{"problem_id": "a", "suite": "s"}\n{"problem_id": "b", "suite": "s"}\n{"problem_id": "c", "su')
    store = ResultsStore(path)
    with caplog.at_level(logging.WARNING, logger="evals.results"):
        assert [r["problem_id"] for r in store.load()] == ["a", "b"]
    assert "truncated last record" in caplog.text
    store.append({"problem_id": "c", "suite": "s"})
    assert [json.loads(line)["problem_id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]
    assert [r["problem_id"] for r in ResultsStore(path).load()] == ["a", "b", "c"]


def test_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"problem_id": "a"}')
    store = ResultsStore(path)
    store.append({"problem_id": "b"})
    assert [r["problem_id"] for r in store.load()] == ["a", "b"]


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"problem_id": "a"}\nnot json\n{"problem_id": "b"}\n')
    with pytest.raises(ValueError, match="r.jsonl: line 2 is not a JSON record"):
        ResultsStore(path).load()


def test_resume_lists_only_unrecorded_problems(tmp_path):
    problems = load_suite("smoke")
    store = ResultsStore(tmp_path / "r.jsonl")
    assert store.load() == [] and [p.id for p, _ in store.pending(problems)] == [p.id for p in problems]
    store.append({"problem_id": problems[0].id, "suite": "smoke", "sample_index": 0})
    store.append({"problem_id": problems[2].id, "suite": "smoke"})
    store.append({"problem_id": problems[3].id, "suite": "other-suite"})  # another suite's record does not count
    pending = store.pending(problems)
    assert [p.id for p, _ in pending] == [p.id for i, p in enumerate(problems) if i not in (0, 2)]
    assert record_key("smoke", problems[0].id) in store.recorded_keys()
    two = store.pending(problems[:1], samples_per_problem=2)
    assert [(p.id, i) for p, i in two] == [(problems[0].id, 1)]
    with pytest.raises(ValueError, match="samples_per_problem"):
        store.pending(problems, samples_per_problem=0)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 40])
def test_shards_are_disjoint_cover_all_and_balanced(count):
    problems = load_suite("builtin") + load_suite("smoke")
    parts = [shard(problems, i, count) for i in range(count)]
    ids = [p.label() for part in parts for p in part]
    assert sorted(ids) == sorted(p.label() for p in problems)  # cover, and no problem twice
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    for part in parts:  # input order is kept within a shard
        positions = [problems.index(p) for p in part]
        assert positions == sorted(positions)


def test_shards_do_not_depend_on_input_order():
    problems = load_suite("builtin")
    forward = {p.id for p in shard(problems, 1, 3)}
    backward = {p.id for p in shard(list(reversed(problems)), 1, 3)}
    assert forward == backward


def test_shard_arguments_are_checked():
    problems = load_suite("smoke")
    assert parse_shard("0/4") == (0, 4) and parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "1/0", "1/2/3"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    with pytest.raises(ValueError, match="0 <= index < count"):
        shard(problems, 2, 2)
    with pytest.raises(ValueError, match="duplicates: smoke:smoke.relu"):
        shard(problems + problems[:1], 0, 2)


# -- one run per output folder ----------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
HOLDER = textwrap.dedent("""
    import sys, time
    from evals.results import OutputFolderLock
    with OutputFolderLock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(120)
""")


def _hold_lock(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
    return holder


def test_a_second_eval_on_a_locked_folder_fails_fast_naming_the_folder_and_the_pid(tmp_path):
    out = tmp_path / "run"
    holder = _hold_lock(out)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "kforge.cli", "eval", "smoke", "--source", "compile", "--device", "cpu",
             "--quick", "--no-plots", "--out", str(out), "--resume"],
            capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr
    assert lines[0].startswith("kforge eval: output folder") and str(out) in lines[0]
    assert f"pid {holder.pid}" in lines[0] and "--out" in lines[0]
    assert not (out / "results.jsonl").exists() and not (out / "run.json").exists()  # nothing was touched


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = _hold_lock(tmp_path)
    with pytest.raises(OutputFolderBusyError):
        OutputFolderLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with OutputFolderLock(tmp_path) as lock:  # the kernel dropped the dead run's lock
        assert lock.held
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_lock_is_exclusive_within_one_process_and_released_on_exit(tmp_path):
    with OutputFolderLock(tmp_path / "new") as first:
        assert (tmp_path / "new").is_dir()
        with pytest.raises(OutputFolderBusyError) as info:
            OutputFolderLock(tmp_path / "new").acquire()
        assert info.value.holder["pid"] == os.getpid() and str(tmp_path / "new") in str(info.value)
        assert isinstance(info.value, RuntimeError)
    assert not first.held
    OutputFolderLock(tmp_path / "new").acquire().release()


def test_a_holder_that_has_not_written_its_pid_yet_is_reported_as_unknown(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    import fcntl

    with open(tmp_path / LOCK_FILE, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(OutputFolderBusyError, match="pid unknown"):
            OutputFolderLock(tmp_path).acquire()
