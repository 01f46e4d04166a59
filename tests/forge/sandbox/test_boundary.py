"""The sandbox boundary (issue 9), probed as an attacker would: each probe runs a real candidate (screening off, so
the escape code reaches the child) inside bubblewrap and shows it blocked; a control run of the same probe with
`isolation="none"` (the pre-boundary sandbox) shows the probe does escape when the boundary is missing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

import agent
from forge.checking import KernelUtils
from forge.judging import HarnessLimit
from forge.samples import Sample
from forge.sandbox import IsolationLevel, SandboxUnavailableError, boundary_isolation
from forge.sandbox.isolation import UNSAFE_ENV, readonly_paths, reset_probes, sandbox_cache_dir
from tests.sandbox_run import judge_file

FAST = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)
REPO = Path(agent.__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not boundary_isolation().safe,
                                reason=f"no sandbox boundary on this host: {boundary_isolation().reason}")

KERNEL = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl
    # HEADER


    @triton.jit
    def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


    def kernel_function(input, inplace=False):
        # BODY
        x = input.contiguous()
        y = torch.empty_like(x)
        _relu_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
        return y
    """
)


def kernel(header: str = "", body: str = "") -> str:
    source = KERNEL.replace("# HEADER", textwrap.dedent(header).strip("\n"))
    return source.replace("    # BODY", textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") or "    pass")


def run(source: str, **kwargs):
    kwargs.setdefault("kernel_utils", FAST)
    kwargs.setdefault("benchmark", False)
    kwargs.setdefault("timeout_s", 90)
    kwargs.setdefault("screen", False)  # UNSAFE on purpose: the probes must reach the child
    return judge_file(source, "relu", [Sample((torch.randn(4, 32),), {})], **kwargs)


def tagged(stdout: str, tag: str) -> dict:
    line = next((line for line in stdout.splitlines() if line.startswith(tag + " ")), None)
    assert line is not None, f"no {tag} line in the child's output:\n{stdout}"
    return json.loads(line.split(" ", 1)[1])


def processes_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_gone(marker: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------------------------------
# Reads and writes outside the run folder, sockets, signals
# ---------------------------------------------------------------------------------------------------------
ESCAPE = """
import json
import os
import signal
import socket

_DONE = []


def _try(action):
    try:
        return action()
    except OSError as exc:
        return type(exc).__name__


def _write(path):
    with open(path, "a") as fh:
        fh.write("")
    return "written"


def _connect(path):
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(3)
    client.connect(path)
    client.sendall(b"hello from the sandbox")
    client.close()
    return "connected"


def _escape():
    if _DONE:
        return
    _DONE.append(True)
    out = {
        "parent_environ": _try(lambda: "read" if b"PATH=" in open("/proc/%d/environ" % PARENT, "rb").read()
                               else "empty"),
        "victim_environ": _try(lambda: "secret" if b"sk-boundary" in open("/proc/%d/environ" % VICTIM, "rb").read()
                               else "no-secret"),
        "shadow": _try(lambda: open("/etc/shadow").read(1) and "read"),
        "provider": _try(lambda: _write(PROVIDER)),
        "kernel_cache": _try(lambda: _write(os.path.join(KERNEL_CACHE, "planted.py"))),
        "parent_triton_cache": _try(lambda: _write(os.path.join(PARENT_TRITON, "planted.so"))),
        "unix_socket": _try(lambda: _connect(SOCKET)),
        "kill_victim": _try(lambda: os.kill(VICTIM, signal.SIGKILL) or "killed"),
        "see_parent": _try(lambda: os.kill(PARENT, 0) or "visible"),
        "ppid": os.getppid(),
        "home_listing": _try(lambda: sorted(os.listdir(REAL_HOME))),
    }
    print("ESCAPE", json.dumps(out), flush=True)
"""


@pytest.fixture
def escape_setup(tmp_path, monkeypatch):
    kernel_cache, parent_triton = tmp_path / "kforge-cache", tmp_path / "parent-triton"
    kernel_cache.mkdir()
    parent_triton.mkdir()
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(kernel_cache))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(parent_triton))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_path = tmp_path / "parent.sock"
    server.bind(str(sock_path))
    server.listen(4)
    server.settimeout(0.5)
    env = {**os.environ, "OPENAI_API_KEY": "sk-boundary-secret-value"}
    victim = subprocess.Popen(["sleep", "120"], env=env)
    header = ESCAPE + "\n" + "\n".join([
        f"PARENT = {os.getpid()}", f"VICTIM = {victim.pid}", f"PROVIDER = {str(REPO / 'agent' / 'provider.py')!r}",
        f"KERNEL_CACHE = {str(kernel_cache)!r}", f"PARENT_TRITON = {str(parent_triton)!r}",
        f"SOCKET = {str(sock_path)!r}", f"REAL_HOME = {os.path.expanduser('~')!r}",
    ])
    provider_before = (REPO / "agent" / "provider.py").stat().st_mtime_ns
    yield {"source": kernel(header, "_escape()"), "victim": victim, "server": server,
           "kernel_cache": kernel_cache, "parent_triton": parent_triton}
    victim.kill()
    victim.wait()
    server.close()
    assert (REPO / "agent" / "provider.py").stat().st_mtime_ns == provider_before


def test_boundary_blocks_proc_files_sockets_and_signals(escape_setup) -> None:
    result = run(escape_setup["source"])
    assert result.status == "ok", (result.message, result.details, result.stderr)
    assert result.isolation is IsolationLevel.BOUNDARY
    out = tagged(result.stdout, "ESCAPE")
    assert out["parent_environ"] == "FileNotFoundError"      # the parent's /proc entry does not exist in there
    assert out["victim_environ"] == "FileNotFoundError"
    assert out["shadow"] == "FileNotFoundError"
    assert out["provider"] == "OSError"                       # EROFS: the installed package is read-only
    assert out["kernel_cache"] == "FileNotFoundError"         # caches are not mounted at all
    assert out["parent_triton_cache"] == "FileNotFoundError"
    assert out["unix_socket"] in {"FileNotFoundError", "ConnectionRefusedError"}
    assert out["kill_victim"] == "ProcessLookupError"
    assert out["see_parent"] == "ProcessLookupError"
    assert out["ppid"] == 0                                   # PID 1 of its own namespace
    # No home: at most the empty mount points leading to a bound interpreter (e.g. ~/.pyenv/versions/...) and to
    # the sandbox-only Triton cache (~/.cache/kforge-sandbox)
    home = Path(os.path.expanduser("~"))
    bound = [Path(p) for p in readonly_paths()] + [sandbox_cache_dir()]
    leading = {p.relative_to(home).parts[0] for p in bound if p.is_relative_to(home)}
    assert out["home_listing"] == "FileNotFoundError" or set(out["home_listing"]) <= leading
    assert escape_setup["victim"].poll() is None, "the victim outside the sandbox must survive"
    assert not list(escape_setup["kernel_cache"].iterdir()) and not list(escape_setup["parent_triton"].iterdir())
    with pytest.raises(TimeoutError):
        escape_setup["server"].accept()


def test_without_the_boundary_the_same_probe_escapes(escape_setup, caplog) -> None:
    """The control: the pre-boundary sandbox (`isolation="none"`) lets every probe above through."""
    with caplog.at_level(logging.WARNING, logger="forge.sandbox.isolation"):
        result = run(escape_setup["source"], isolation="none")
    assert result.status == "ok", (result.message, result.details, result.stderr)
    assert result.isolation is IsolationLevel.NONE
    out = tagged(result.stdout, "ESCAPE")
    assert out["parent_environ"] == "read" and out["victim_environ"] == "secret"
    assert out["kernel_cache"] == "written" and out["parent_triton_cache"] == "written"
    assert out["unix_socket"] == "connected"
    assert out["kill_victim"] == "killed" and out["see_parent"] == "visible"
    if os.geteuid() == 0:
        assert out["shadow"] == "read" and out["provider"] == "written"
    connection, _ = escape_setup["server"].accept()
    assert connection.recv(64) == b"hello from the sandbox"
    connection.close()


# ---------------------------------------------------------------------------------------------------------
# Process and memory limits
# ---------------------------------------------------------------------------------------------------------
LIMITS = """
import json
import os
import time

_DONE = []


def _fork_and_grow():
    if _DONE:
        return
    _DONE.append(True)
    forks, fork_error = 0, None
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError as exc:
            fork_error = type(exc).__name__
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        forks += 1
    chunks, grown, grow_error = [], 0, None
    try:
        while grown < TARGET:
            chunks.append(bytearray(256 << 20))
            grown += 256 << 20
    except MemoryError:
        grow_error = "MemoryError"
    del chunks
    print("LIMITS", json.dumps({"forks": forks, "fork_error": fork_error, "grown": grown,
                                "grow_error": grow_error}), flush=True)
"""


def test_process_limit_holds() -> None:
    """As an ordinary user the kernel refuses the 64th task (RLIMIT_NPROC); as root (exempt from it) the parent
    counts the sandbox's tasks and kills it."""
    source = kernel(LIMITS + "\nTARGET = 0", "_fork_and_grow()")
    result = run(source, process_limit=64)
    if os.geteuid() == 0:  # a limit of the harness, reached: harness_error naming it, not the kernel's crash
        assert result.status == "harness_error", (result.message, result.details, result.stdout)
        assert result.limit is HarnessLimit.PROCESSES and result.details["tasks"] > 64
        assert "LIMITS" not in result.stdout, "the loop of 200 forks must not complete"
    else:
        assert result.status == "ok", (result.message, result.details, result.stderr)
        out = tagged(result.stdout, "LIMITS")
        assert out["fork_error"] == "BlockingIOError" and out["forks"] < 64


def test_memory_limit_holds() -> None:
    source = kernel(LIMITS.replace("range(200)", "range(0)") + "\nTARGET = 5 << 30", "_fork_and_grow()")
    result = run(source, memory_limit_bytes=1 << 30)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    out = tagged(result.stdout, "LIMITS")
    assert out["grow_error"] == "MemoryError" and out["grown"] < 1 << 30


@pytest.mark.slow  # about 30 s: 200 forks of a process that imported torch, on a small CPU machine
def test_without_limits_the_same_probe_forks_200_and_maps_5_gb() -> None:
    """The control (the mappings are never touched, so this costs no real memory)."""
    source = kernel(LIMITS + "\nTARGET = 5 << 30", "_fork_and_grow()")
    result = run(source, process_limit=None, memory_limit_bytes=None)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    out = tagged(result.stdout, "LIMITS")
    assert out["forks"] == 200 and out["fork_error"] is None
    assert out["grown"] >= 5 << 30 and out["grow_error"] is None


# ---------------------------------------------------------------------------------------------------------
# Orphans, timeouts and the parent's death
# ---------------------------------------------------------------------------------------------------------
def orphan_header(marker: str, hang: bool = False) -> str:
    lines = [
        "import subprocess",
        "import sys",
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}], "
        "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
    ]
    if hang:
        lines.append("while True:\n    pass")
    return "\n".join(lines)


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_setsid_grandchildren_die_with_the_sandbox(isolation: str) -> None:
    marker = f"kforge-orphan-{uuid.uuid4().hex}"
    result = run(kernel(orphan_header(marker)), isolation=isolation)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    survivors = wait_gone(marker, timeout_s=5.0)
    kill_pids(survivors)
    if isolation == "auto":
        assert survivors == [], "a setsid grandchild outlived the sandbox"
    else:
        assert survivors, "control: without the boundary the grandchild survives"


def test_setsid_grandchildren_die_on_timeout() -> None:
    marker = f"kforge-orphan-{uuid.uuid4().hex}"
    result = run(kernel(orphan_header(marker, hang=True)), timeout_s=15)
    assert result.status == "timeout"
    survivors = wait_gone(marker, timeout_s=10.0)
    kill_pids(survivors)
    assert survivors == []


_PARENT_SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    from tests.sandbox_run import judge_file
    from forge.samples import Sample

    source = open(sys.argv[2]).read()
    judge_file(source, "relu", [Sample((torch.randn(4, 32),), {})], workdir=sys.argv[1], timeout_s=300,
                  screen=False, benchmark=False)
    """
)


def test_the_sandbox_dies_with_its_parent(tmp_path) -> None:
    folder = tmp_path / f"run-{uuid.uuid4().hex}"
    source_file = tmp_path / "candidate.py"
    source_file.write_text(kernel("while True:\n    pass"))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT_SCRIPT, str(folder), str(source_file)],
                              cwd=str(REPO), start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not processes_with(str(folder)):
            assert parent.poll() is None, "the parent ended before the candidate started"
            assert time.monotonic() < deadline, "the candidate never started"
            time.sleep(0.1)
        time.sleep(5)  # the child imports torch and the candidate, then loops
        assert processes_with(str(folder))
        parent.kill()
        parent.wait()
        survivors = wait_gone(str(folder), timeout_s=10.0)
        kill_pids(survivors)
        assert survivors == [], "the sandbox outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_real_segfault_is_a_crash_with_its_signal() -> None:
    result = run(kernel("import ctypes", "ctypes.string_at(0)"))
    assert result.status == "crash", (result.message, result.details)
    assert result.details["signal"] == "SIGSEGV"


# ---------------------------------------------------------------------------------------------------------
# No boundary: refuse, unless the user opts out (one warning)
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_bwrap(tmp_path, monkeypatch):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    reset_probes()
    yield
    reset_probes()


def test_without_bubblewrap_generation_refuses_and_runs_nothing(no_bwrap, tmp_path) -> None:
    marker = tmp_path / "ran"
    source = kernel(f"open({str(marker)!r}, 'w').close()")
    with pytest.raises(SandboxUnavailableError, match="bubblewrap.*--unsafe-sandbox"):
        run(source)
    with pytest.raises(SandboxUnavailableError):
        run(source, isolation="boundary", allow_unsafe=True)  # "boundary" never falls back
    assert not marker.exists()


def test_the_explicit_opt_out_runs_with_one_warning(no_bwrap, monkeypatch, caplog) -> None:
    monkeypatch.setenv(UNSAFE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="forge.sandbox.isolation"):
        first, second = run(kernel()), run(kernel())
    assert first.status == "ok" and second.status == "ok"
    assert first.isolation is IsolationLevel.NONE  # neither bwrap nor unshare is on this PATH
    assert "bubblewrap" in first.isolation_reason
    warnings = [r for r in caplog.records if "UNSAFE SANDBOX" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_cli_refuses_without_the_boundary_unless_unsafe_sandbox(no_bwrap, tmp_path, monkeypatch) -> None:
    from agent.cli_support import add_generator_arguments, generators_from_args

    cassette = tmp_path / "calls.jsonl"
    cassette.write_text("")
    monkeypatch.setenv("KFORGE_CASSETTE", str(cassette))
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser()
    add_generator_arguments(parser)
    with pytest.raises(SystemExit, match="--unsafe-sandbox"):
        generators_from_args(parser.parse_args([]))
    generators = generators_from_args(parser.parse_args(["--unsafe-sandbox"]))
    assert len(generators) == 1 and os.environ[UNSAFE_ENV] == "1"
    generators[0].close()


def test_the_pool_says_before_any_run_whether_it_would_refuse(no_bwrap) -> None:
    from forge.sandbox import SandboxOptions, SandboxPool

    with pytest.raises(SandboxUnavailableError):
        SandboxPool(1).isolation()
    assert SandboxPool(1, SandboxOptions(allow_unsafe=True)).isolation().level is IsolationLevel.NONE
    reset_probes()


def test_a_folder_of_installed_packages_on_the_python_path_is_importable_and_a_project_folder_is_not(
        tmp_path, monkeypatch) -> None:
    """A module target's library may be installed with `pip install --target DIR` on `PYTHONPATH` (the GPU host's
    wheels: diffusers there failed every UNet judging with `No module named 'diffusers'`). Such a folder holds
    `*.dist-info` records and is bound read-only; a folder of the user's project on the same path is not."""
    site, project = tmp_path / "site", tmp_path / "project"
    (site / "kforge_probe_lib").mkdir(parents=True)
    (site / "kforge_probe_lib" / "__init__.py").write_text("VALUE = 42\n")
    (site / "kforge_probe_lib-1.0.dist-info").mkdir()
    project.mkdir()
    (project / "kforge_probe_project.py").write_text("SECRET = 'key'\n")
    for folder in (site, project):
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(project), os.environ.get("PYTHONPATH", "")]))
    readonly_paths.cache_clear()
    try:
        assert str(site) in readonly_paths() and str(project) not in readonly_paths()
        result = run(kernel(body='''
            import importlib, json
            found = {}
            for name in ("kforge_probe_lib", "kforge_probe_project"):
                try:
                    found[name] = repr(importlib.import_module(name).__dict__.get("VALUE"))
                except ImportError as exc:
                    found[name] = type(exc).__name__
            print("IMPORTS " + json.dumps(found), flush=True)
        '''))
    finally:
        readonly_paths.cache_clear()
    assert result.status == "ok", (result.message, result.stderr)
    assert tagged(result.stdout, "IMPORTS") == {"kforge_probe_lib": "42", "kforge_probe_project": "ModuleNotFoundError"}
