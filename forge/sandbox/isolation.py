"""The sandbox boundary: every candidate child runs inside bubblewrap (`bwrap`), or generation refuses to run.

Why bubblewrap: it is a small, maintained, setuid-free tool (the sandbox under Flatpak) that builds exactly the
boundary a kernel needs from Linux namespaces, installs with one package (`apt-get install bubblewrap`, present on
most distributions) and runs both as root (CI, GPU hosts) and as an ordinary user (through unprivileged user
namespaces). nsjail needs a source build (not in Debian's or PyPI's indexes); Landlock restricts files only (no PID
or network namespace, kernel >= 5.13 and no Python binding in the standard library); `unshare` alone gives no
read-only file view without a hand-written mount script.

What the boundary is (`bwrap_command`): new user, PID, mount, network, IPC, UTS and cgroup namespaces; uid/gid 65534
inside, all capabilities dropped, a new session (no terminal injection); a fresh `/proc` that shows only the sandbox's
processes (no parent `/proc/<pid>/environ`); a minimal `/dev` (+ the NVIDIA device nodes for CUDA runs); a private
tmpfs `/tmp` and `/dev/shm` and a private scratch tmpfs (home, temporary folder, compiled-kernel caches), each of
bounded size where bubblewrap knows `--size`; read-only binds of the system (`/usr`, the `/lib*` and `/bin` roots, a
handful of non-secret `/etc` files: loader cache, passwd/group, alternatives), of the interpreter and its
site-packages (and other folders of installed packages on the Python path: `pip install --target`), and of the
repository's `agent` and `forge` packages (not the repository root, which may hold keys or `.env` files, nor the
user's project on the Python path), of the run folder the parent wrote and of the caches the parent filled for
children (prebuilt CUDA binaries); nothing writable outside the tmpfs mounts, nothing else (no home, no `/etc/shadow`,
no caches, no sockets under `/run` or `/tmp`). The child is PID 1 of its namespace: when it exits, or when bwrap dies,
the kernel kills every process left in it (`setsid` grandchildren included); `--die-with-parent` kills the sandbox
when the process that started it dies. Resource limits (memory through RLIMIT_DATA, processes through RLIMIT_NPROC,
CPU time, file size, open files) are set by the child before any candidate code runs
(`forge.sandbox.child.apply_limits`); the child has no capability to raise them again. The kernel exempts uid 0 from
RLIMIT_NPROC, and when kforge runs as root the sandbox's uid maps to root (bwrap maps only the caller's uid; running
bwrap as another user fails where the interpreter lives in a 0700 home, e.g. pyenv in /root): there the parent counts
the tasks in the sandbox's PID namespace every 0.1 s and kills it past the limit (`runner._SandboxTasks`). Memory is
not limited through cgroups: the host's cgroup tree belongs to the container manager, and RLIMIT_DATA needs no
privileges.

Levels (`IsolationLevel`): `BOUNDARY` (the above), `NETWORK` (only a network namespace through `unshare -n`; the
pre-bubblewrap sandbox) and `NONE`. Anything below `BOUNDARY` is unsafe: `resolve_isolation` refuses it with
`SandboxUnavailableError` unless the caller opts out explicitly (`allow_unsafe=True`, the `--unsafe-sandbox` flag or
`KFORGE_UNSAFE_SANDBOX=1`), and then logs one warning per process and level. The level a run got is in
`Verdict.isolation`.
"""

from __future__ import annotations

import enum
import functools
import glob
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from forge.errors import KernelForgeError

__all__ = [
    "UNSAFE_ENV",
    "Isolation",
    "IsolationLevel",
    "SandboxUnavailableError",
    "boundary_isolation",
    "bwrap_command",
    "network_isolation",
    "readonly_paths",
    "reset_probes",
    "resolve_isolation",
    "sandbox_cache_dir",
    "unsafe_allowed",
]

logger = logging.getLogger(__name__)

UNSAFE_ENV = "KFORGE_UNSAFE_SANDBOX"
SANDBOX_UID = 65534  # "nobody": has a passwd entry (getpass/pwd work) and owns nothing
_PROBE_TIMEOUT_S = 30

# Top-level system folders bound read-only (or recreated as the same symlink on merged-/usr systems).
_SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc entries a Python + compiler toolchain needs; nothing secret (no shadow, no ssh, no credentials).
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
              "/etc/nsswitch.conf", "/etc/localtime", "/etc/alternatives")
# Environment variables naming toolchain files or folders the child needs to read.
_TOOLCHAIN_ENV = ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_LIBDEVICE_PATH")
# Compilers the child runs (Triton compiles its launcher stubs with $CC); a compiler outside the system roots (the
# GPU host's /opt/gcc) is bound read-only with its install prefix, or the child's first launch fails.
_COMPILER_ENV = ("CC", "CXX")
_NEVER_BIND = ("/", "/proc", "/sys", "/dev", "/tmp", "/run", "/var", "/etc", "/home", "/root")


class IsolationLevel(enum.StrEnum):
    """How a sandbox child is isolated (see the module docstring). Only `BOUNDARY` is safe for untrusted code."""

    BOUNDARY = "boundary"
    NETWORK = "network"
    NONE = "none"


class SandboxUnavailableError(KernelForgeError, RuntimeError):
    """The bubblewrap boundary cannot be set up here and the caller did not opt out of it."""


@dataclass(frozen=True)
class Isolation:
    """The isolation a child gets: its level, why (what was probed), the tool that provides it, and (for the
    NETWORK level) the command prefix that starts a program in a fresh network namespace."""

    level: IsolationLevel
    reason: str
    tool: str | None = None
    prefix: tuple[str, ...] = ()

    @property
    def safe(self) -> bool:
        return self.level is IsolationLevel.BOUNDARY


def unsafe_allowed(explicit: bool | None = None) -> bool:
    """Whether the user opted out of the boundary: `explicit` when given, else `KFORGE_UNSAFE_SANDBOX` is on
    (1/true/yes/on; a value that is no flag is a one-line `SettingError`)."""
    if explicit is not None:
        return bool(explicit)
    from forge.env import env_flag

    return env_flag(UNSAFE_ENV, False)


def sandbox_cache_dir() -> Path:
    """Where this process keeps what it builds for sandbox children (the CUDA build pool's binaries), which children
    read but never write: never the parent's own kernel cache, which the parent loads code from.
    `KFORGE_SANDBOX_CACHE_DIR`, else `~/.cache/kforge-sandbox`."""
    configured = os.environ.get("KFORGE_SANDBOX_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kforge-sandbox"


# ---------------------------------------------------------------------------------------------------------
# The bubblewrap command
# ---------------------------------------------------------------------------------------------------------
def _python_paths() -> list[str]:
    """What the child imports: the interpreter, the site-packages folders and other folders of installed packages on
    the Python path (`_holds_distributions`), wherever torch / triton / numpy are installed, and the repository's
    `agent` and `forge` packages. Not the repository root (it may hold `.env` files, keys, data) nor the rest of the
    parent's Python path (the user's own project)."""
    import importlib.util

    from forge.sandbox.environment import repository_root

    repo = repository_root()
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, str(repo / "agent"), str(repo / "forge")]
    paths += [p for p in sys.path if os.path.basename(os.path.normpath(p or ".")) in {"site-packages",
                                                                                      "dist-packages"}]
    paths += [p for p in sys.path if _holds_distributions(p)]
    for module in ("torch", "triton", "numpy"):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:
            paths += [os.path.dirname(location) for location in spec.submodule_search_locations]
    for name in _TOOLCHAIN_ENV:
        value = os.environ.get(name)
        if value:
            paths.append(value if os.path.isdir(value) else os.path.dirname(value))
    for name in _COMPILER_ENV:  # Triton builds its launchers with $CC: its whole install prefix (bin, lib, libexec)
        found = shutil.which(os.environ[name]) if os.environ.get(name) else None
        if found:
            binary = os.path.realpath(found)
            folder = os.path.dirname(binary)
            paths.append(os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder)
    paths += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return paths


def _holds_distributions(path: str) -> bool:
    """A folder of installed packages outside site-packages (`pip install --target DIR`, on `PYTHONPATH`): it holds
    `*.dist-info` records. A module target's library may live there (the GPU host's wheels do), and the child
    must import it to rebuild the instance; a project folder (no `*.dist-info`) stays out."""
    try:
        return bool(path) and os.path.isdir(path) and any(n.endswith(".dist-info") for n in os.listdir(path))
    except OSError:
        return False


def _bindable(path: str) -> bool:
    """Existing absolute paths that are not a system-wide or private folder (/, /etc, /proc, home...) nor an
    ancestor of the home folder or of the repository (which would expose everything below)."""
    from forge.sandbox.environment import repository_root

    if not os.path.isabs(path) or not os.path.exists(path) or path in _NEVER_BIND:
        return False
    if path.startswith(("/proc/", "/sys/", "/dev/", "/run/")):
        return False
    for private in (os.path.expanduser("~"), str(repository_root())):
        if private == path or private.startswith(path.rstrip(os.sep) + os.sep):
            return False
    return True


@functools.cache
def readonly_paths() -> tuple[str, ...]:
    """Folders and files bound read-only besides the system roots: the interpreter and its packages, the
    repository's `agent` and `forge` packages, and the toolchain (both the path as written and its real target),
    outermost first, nested ones dropped."""
    found: set[str] = set()
    for raw in _python_paths():
        for path in {os.path.abspath(raw), os.path.realpath(raw)}:
            if _bindable(path):
                found.add(path)
    kept: list[str] = []
    for path in sorted(found, key=lambda p: (p.count(os.sep), p)):
        if not any(path == k or path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return tuple(kept)


def _system_args() -> list[str]:
    args: list[str] = []
    for root in _SYSTEM_ROOTS:
        if os.path.islink(root):
            args += ["--symlink", os.readlink(root), root]
        elif os.path.isdir(root):
            args += ["--ro-bind", root, root]
    for path in _ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _gpu_args() -> list[str]:
    args: list[str] = []
    for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
        args += ["--dev-bind", node, node]
    if os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]  # the CUDA driver reads PCI and NUMA topology there
    return args


@functools.cache
def _bwrap_options(bwrap: str) -> str:
    """`bwrap --help` (which options this bubblewrap knows)."""
    try:
        return subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def bwrap_command(
    bwrap: str,
    argv: Sequence[str],
    *,
    folder: Path,
    scratch: Path | None = None,
    scratch_bytes: int | None = None,
    readonly: Iterable[Path] = (),
    writable: Iterable[Path] = (),
    gpu: bool = False,
) -> list[str]:
    """`argv` inside the boundary: `folder` (the run folder the parent wrote, also the working directory) and
    `readonly` folders read-only, a private tmpfs at `scratch` (of `scratch_bytes`, like `/tmp` and `/dev/shm`)
    as the only writable place besides `writable`, the interpreter, its packages, the repository's packages and the
    system read-only, nothing else (see the module docstring)."""
    sized = "--size" in _bwrap_options(bwrap) and scratch_bytes is not None

    def tmpfs(path: str) -> list[str]:
        return (["--size", str(scratch_bytes)] if sized else []) + ["--tmpfs", path]

    args = [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "kforge-sandbox",
        "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL",
        *tmpfs("/tmp"), "--proc", "/proc", "--dev", "/dev", *tmpfs("/dev/shm"),
    ]
    if "--disable-userns" in _bwrap_options(bwrap):  # bubblewrap >= 0.8: no nested user namespaces inside
        args.insert(1, "--disable-userns")
    args += _system_args()
    for path in readonly_paths():
        args += ["--ro-bind", path, path]
    if gpu:
        args += _gpu_args()
    for path, mode in [(folder, "--ro-bind"), *((p, "--ro-bind") for p in readonly),
                       *((p, "--bind") for p in writable)]:
        resolved = str(Path(path).resolve())
        args += [mode, resolved, resolved]
        if str(path) != resolved:
            args += [mode, resolved, str(path)]
    if scratch is not None:
        args += tmpfs(str(scratch))
    args += ["--chdir", str(folder), "--", *argv]
    return args


# ---------------------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------------------
_LOCK = threading.Lock()
_BOUNDARY: Isolation | None = None
_NETWORK: Isolation | None = None
_WARNED: set[IsolationLevel] = set()


def _run_probe(argv: list[str], cwd: str | None = None) -> str | None:
    """None when `argv` ran and exited 0, else why not."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=cwd,
                              timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def _probe_boundary() -> Isolation:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Isolation(IsolationLevel.NONE, "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kforge-probe-") as folder:
        argv = bwrap_command(bwrap, [sys.executable, "-I", "-S", "-c", "pass"], folder=Path(folder))
        problem = _run_probe(argv, cwd=folder)
    if problem is not None:
        return Isolation(IsolationLevel.NONE, f"bubblewrap could not start a sandbox here: {problem}", bwrap)
    return Isolation(IsolationLevel.BOUNDARY, "bubblewrap: user, PID, mount, network, IPC and UTS namespaces; "
                     "read-only system and Python; private scratch", bwrap)


def _probe_network() -> Isolation:
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation(IsolationLevel.NONE, "the unshare command is not installed")
    failures = []
    for flag in (("-n", "-rn") if os.geteuid() == 0 else ("-rn", "-n")):
        problem = _run_probe([unshare, flag, "true"])
        if problem is None:
            return Isolation(IsolationLevel.NETWORK, f"unshare {flag}: a fresh network namespace only", unshare,
                             (unshare, flag))
        failures.append(f"unshare {flag}: {problem}")
    return Isolation(IsolationLevel.NONE, "unshare failed (" + "; ".join(failures) + ")")


def boundary_isolation(*, refresh: bool = False) -> Isolation:
    """The bubblewrap boundary on this host (`level` BOUNDARY), or why it is unavailable (`level` NONE); probed once
    per process by starting the interpreter inside it."""
    global _BOUNDARY
    with _LOCK:
        if _BOUNDARY is None or refresh:
            _BOUNDARY = _probe_boundary()
            logger.debug("sandbox boundary: %s (%s)", _BOUNDARY.level, _BOUNDARY.reason)
        return _BOUNDARY


def network_isolation(*, refresh: bool = False) -> Isolation:
    """The unsafe fallback: a network namespace through `unshare` (`level` NETWORK), or NONE with the reason."""
    global _NETWORK
    with _LOCK:
        if _NETWORK is None or refresh:
            _NETWORK = _probe_network()
        return _NETWORK


def reset_probes() -> None:
    """Forget the cached probes and warnings (after installing bubblewrap in a long-lived process; tests)."""
    global _BOUNDARY, _NETWORK
    with _LOCK:
        _BOUNDARY = _NETWORK = None
        _WARNED.clear()
    readonly_paths.cache_clear()


def _warn_once(isolation: Isolation) -> None:
    with _LOCK:
        if isolation.level in _WARNED:
            return
        _WARNED.add(isolation.level)
    logger.warning(
        "UNSAFE SANDBOX: generated kernels run with isolation %r (%s). They can read your files and, without a PID "
        "namespace, other processes' environments (API keys); use only with code you trust. Install bubblewrap to "
        "get the boundary.", isolation.level.value, isolation.reason)


def resolve_isolation(request: str | IsolationLevel = "auto", *, allow_unsafe: bool | None = None) -> Isolation:
    """The isolation to run a child with.

    `request`: `"auto"` (the boundary; when it is unavailable, `SandboxUnavailableError` unless the user opted out,
    then the best weaker level), `"boundary"` (the boundary or the error, whatever the opt-out), `"network"` or
    `"none"` (an explicit unsafe choice, for tests and trusted code). Every level below the boundary logs one
    warning per process; none is ever chosen silently.
    """
    value = request.value if isinstance(request, IsolationLevel) else request
    if value not in {"auto", "boundary", "network", "none"}:
        raise ValueError(f"isolation must be 'auto', 'boundary', 'network' or 'none', got {request!r}")
    if value == "none":
        chosen = Isolation(IsolationLevel.NONE, "isolation='none' was requested")
    elif value == "network":
        chosen = network_isolation()
        if chosen.level is not IsolationLevel.NETWORK:
            raise SandboxUnavailableError(f"a network namespace was requested but is unavailable: {chosen.reason}")
    else:
        boundary = boundary_isolation()
        if boundary.safe:
            return boundary
        if value == "boundary" or not unsafe_allowed(allow_unsafe):
            raise SandboxUnavailableError(
                f"refusing to run generated code: the sandbox boundary is unavailable ({boundary.reason}). Install "
                f"bubblewrap, or opt out explicitly with --unsafe-sandbox / {UNSAFE_ENV}=1 (weaker isolation)")
        fallback = network_isolation()
        chosen = Isolation(fallback.level, f"{fallback.reason}; boundary unavailable: {boundary.reason}",
                           fallback.tool, fallback.prefix)
    _warn_once(chosen)
    return chosen
