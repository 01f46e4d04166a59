"""forge.atomic: concurrent saves never expose half a file, failures leave no temporary, errors name the path."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from forge import atomic
from forge.atomic import write_json_atomic, write_text_atomic
from forge.plan import KernelOptimizationPlan

REPO = Path(__file__).resolve().parents[2]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_writes_text_and_json_and_leaves_nothing_else(tmp_path):
    write_text_atomic(tmp_path / "a.txt", "hello\n")
    write_json_atomic(tmp_path / "b.json", {"x": [1, 2]}, indent=1)
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    assert json.loads((tmp_path / "b.json").read_text()) == {"x": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json"]


def test_new_files_get_default_permissions_and_replaced_files_keep_theirs(tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    fresh = write_text_atomic(tmp_path / "fresh.txt", "x")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    kept = tmp_path / "kept.txt"
    kept.write_text("old")
    kept.chmod(0o640)
    write_text_atomic(kept, "new")
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failure_mid_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, failing):
    target = tmp_path / "plan.json"
    target.write_text('{"old": true}\n')

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, failing, disk_full)
    with pytest.raises(OSError) as info:
        write_json_atomic(target, {"new": True})
    assert info.value.errno == errno.ENOSPC and str(target) in str(info.value)
    assert json.loads(target.read_text()) == {"old": True}
    assert leftovers(tmp_path) == []


def test_an_interrupt_mid_write_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(tmp_path / "x.txt", "data")
    assert list(tmp_path.iterdir()) == []


def test_data_json_cannot_hold_touches_no_file(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "x.json", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_plan_save_into_a_directory_names_it_and_leaves_no_tmp(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as info:
        KernelOptimizationPlan().save(folder)
    assert str(folder) in str(info.value) and "directory" in str(info.value)
    assert list(folder.iterdir()) == [] and leftovers(tmp_path) == []


def test_plan_save_into_a_missing_folder_names_it_and_leaves_no_tmp(tmp_path):
    target = tmp_path / "missing_dir" / "plan.json"
    with pytest.raises(FileNotFoundError) as info:
        KernelOptimizationPlan().save(target)
    assert str(target) in str(info.value) and "does not exist" in str(info.value)
    assert list(tmp_path.iterdir()) == []


WRITER = textwrap.dedent("""
    import sys
    from forge.plan import KernelOptimizationPlan
    path, writer, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # ~300 KB per save, so a save takes many write() calls and a torn file would be visible.
    plan = KernelOptimizationPlan(environment={"writer": writer, "pad": str(writer) * 300_000})
    print("ready", flush=True)
    for _ in range(saves):
        plan.save(path)
""")


def test_two_processes_saving_one_plan_never_show_a_reader_invalid_json(tmp_path):
    path = tmp_path / "plan.json"
    KernelOptimizationPlan(environment={"writer": -1, "pad": ""}).save(path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(i), "150"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for i in (0, 1)]
    try:
        for w in writers:
            assert w.stdout.readline().strip() == "ready", w.stderr.read()
        reads, seen = 0, set()
        deadline = time.monotonic() + 120
        while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
            data = json.loads(path.read_text())  # a torn or swapped file fails here
            writer = data["environment"]["writer"]
            assert data["environment"]["pad"] == ("" if writer == -1 else str(writer) * 300_000)
            seen.add(writer)
            reads += 1
        for w in writers:
            w.wait(timeout=60)
            assert w.returncode == 0, w.stderr.read()
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
    assert reads > 0 and seen & {0, 1}
    assert json.loads(path.read_text())["environment"]["writer"] in (0, 1)
    assert leftovers(tmp_path) == []
