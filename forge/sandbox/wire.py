"""The channel between the harness (parent) and the sandbox child: framed JSON messages plus tensors in memfds.

Why this shape: the verdict is computed in the parent, so the child's outputs must reach it without a file the child
controls and without the parent running anything the child chose. Each message is one frame on a socketpair the
parent created and passed as an inherited descriptor (the boundary unshares the network and IPC namespaces and
gives the child a private /tmp and /dev/shm, so torch's own sharing, which connects to a listener by name, cannot
cross it; an inherited socket can): a 10-byte prefix (JSON length, descriptor count, magic), a JSON header, and the
tensors' storages as anonymous memory files (`memfd_create`) attached with SCM_RIGHTS, sealed against writes and
resizing before they are sent (the receiver refuses an unsealed one: a file that shrank under its mapping would
kill it with SIGBUS). The receiver copies each storage into memory of its own before using it. A hop costs two
host copies (measured on the loaded 2-core CI machine: 64 MB in 0.35 s, where one `clone()` of it took 0.13 s).
CUDA storages
travel through host memory the same way: torch's CUDA IPC needs the sender's /dev/shm reference-count file and a
shared IPC namespace, which the boundary removes (not yet measured on a GPU: see the sandbox tests marked cuda).

Trust: messages from the child are data. The parent decodes a small JSON tree (None, bool, int, float, str, list,
tuple, dict, dtype, Size, tensor references; anything else becomes an opaque marker that fails the oracle's
structure check), never unpickles, bounds the header (`MAX_HEADER_BYTES`), the descriptors per message
(`MAX_FDS`, below the kernel's SCM_MAX_FD of 253), the nesting depth, the leaves and the total bytes, and checks
every tensor view against its storage's size. Messages to the child (inputs and settings from the harness) may be
pickled: that direction is trusted.
"""

from __future__ import annotations

import fcntl
import io
import json
import math
import mmap
import os
import pickle
import socket
import stat
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.errors import KernelForgeError

__all__ = [
    "MAX_FDS",
    "MAX_HEADER_BYTES",
    "Outbox",
    "PeerGone",
    "RemoteObject",
    "ReplyTooLarge",
    "WireError",
    "decode_tree",
    "dump_inputs",
    "encode_tree",
    "load_inputs",
    "read_storage",
    "recv_message",
    "send_message",
    "storage_bytes",
    "storage_key",
]

MAGIC = 0x4B46  # "KF"
_PREFIX = struct.Struct("!IIH")
MAX_HEADER_BYTES = 16 << 20
MAX_FDS = 240
MAX_DEPTH = 32
MAX_LEAVES = 4096
MAX_DIMS = 16
_RECV_CHUNK = 1 << 20
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


class WireError(KernelForgeError):
    """A malformed, oversized or unexpected message."""

    outcome = "harness_error"


class PeerGone(WireError):
    """The other end closed the channel (the child exited or was killed)."""


class ReplyTooLarge(WireError):
    """A message would carry more tensor bytes or storages than the harness allows (`Outbox.max_bytes`,
    `MAX_FDS`): a limit of the harness, reported as such (`harness_error`), never the candidate's fault."""


# ---------------------------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------------------------
def send_message(sock: socket.socket, header: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One frame: prefix, JSON header, the descriptors attached to the first bytes."""
    if len(fds) > MAX_FDS:
        raise WireError(f"{len(fds)} storages in one message; at most {MAX_FDS}")
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise WireError(f"message header of {len(data)} bytes; at most {MAX_HEADER_BYTES}")
    frame = _PREFIX.pack(len(data), len(fds), MAGIC) + data
    try:
        sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
        if sent < len(frame):
            sock.sendall(frame[sent:])
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise PeerGone(f"the channel closed: {exc}") from exc


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next frame's header and descriptors (the caller owns and closes them). `PeerGone` at end of stream."""
    prefix = bytearray()
    fds: list[int] = []
    try:
        while len(prefix) < _PREFIX.size:
            data, got, flags, _ = socket.recv_fds(sock, _PREFIX.size - len(prefix), MAX_FDS,
                                                  socket.MSG_CMSG_CLOEXEC)
            fds += got
            if flags & socket.MSG_CTRUNC:
                _close_all(fds)
                raise WireError("too many descriptors attached to a message")
            if not data:
                _close_all(fds)
                raise PeerGone("the channel closed")
            prefix += data
        length, count, magic = _PREFIX.unpack(bytes(prefix))
        if magic != MAGIC or length > MAX_HEADER_BYTES or count > MAX_FDS or count != len(fds):
            raise WireError(f"bad frame (magic {magic:#x}, {length} header bytes, {count} storages declared, "
                            f"{len(fds)} attached)")
        body = bytearray(length)
        view = memoryview(body)
        done = 0
        while done < length:
            n = sock.recv_into(view[done:], min(length - done, _RECV_CHUNK))
            if not n:
                raise PeerGone("the channel closed in the middle of a message")
            done += n
        header = json.loads(body)
    except (ConnectionResetError, BrokenPipeError) as exc:
        _close_all(fds)
        raise PeerGone(f"the channel closed: {exc}") from exc
    except (ValueError, RecursionError, UnicodeDecodeError, struct.error) as exc:
        _close_all(fds)
        raise WireError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        _close_all(fds)
        raise
    if not isinstance(header, dict):
        _close_all(fds)
        raise WireError("a message header must be a JSON object")
    return header, fds


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------------------
# Storages through memfds
# ---------------------------------------------------------------------------------------------------------
def storage_key(storage: torch.UntypedStorage) -> tuple[str, int] | None:
    """Identity of a storage while it is alive (device, address); None for an empty one (no identity)."""
    if storage.nbytes() == 0:
        return None
    return str(storage.device), storage.data_ptr()


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the storage's bytes (on its device)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def write_storage(storage: torch.UntypedStorage) -> int:
    """A new memfd holding the storage's bytes (copied from the device for CUDA storages)."""
    nbytes = storage.nbytes()
    fd = os.memfd_create("kforge-tensor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if nbytes:
            os.ftruncate(fd, nbytes)
            with mmap.mmap(fd, nbytes) as mm:
                target = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
                target.copy_(storage_bytes(storage))
                del target
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)  # unmapped above: nothing can change or resize it any more
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_storage(fd: int, nbytes: int, device: torch.device | str, into: torch.UntypedStorage | None = None
                 ) -> torch.UntypedStorage:
    """Copy `nbytes` out of a received memfd into a new storage on `device` (or into `into`, same size)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < nbytes:
        raise WireError(f"a storage descriptor is not a memory file of {nbytes} bytes")
    try:
        sealed = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS
    except OSError:
        sealed = False
    if not sealed:  # an unsealed file could shrink under our mapping (SIGBUS here) or change while we copy
        raise WireError("a storage descriptor is not a sealed memory file")
    target = (torch.empty(nbytes, dtype=torch.uint8, device=device) if into is None else storage_bytes(into))
    if into is not None and target.numel() != nbytes:
        raise WireError(f"a storage update of {nbytes} bytes for a storage of {target.numel()}")
    if nbytes:
        with mmap.mmap(fd, nbytes, prot=mmap.PROT_READ) as mm, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "buffer is not writable": it is only read from
            source = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
            target.copy_(source)
            del source
    return target.untyped_storage()


@dataclass
class Outbox:
    """Storages to attach to one message: each distinct storage once, as a memfd; `known` maps storage keys the
    receiver already has to a reference (e.g. the call's input storages)."""

    known: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    fds: list[int] = field(default_factory=list)
    storages: list[dict[str, Any]] = field(default_factory=list)
    max_bytes: int | None = None
    total_bytes: int = 0
    _index: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    keep: list[torch.UntypedStorage] = field(default_factory=list)
    tokens: Callable[[torch.UntypedStorage], tuple[int, bool]] | None = None

    def storage_ref(self, storage: torch.UntypedStorage) -> list[Any]:
        key = storage_key(storage)
        if key is not None and key in self.known:
            return self.known[key]
        if key is not None and key in self._index:
            return self._index[key]
        extra: dict[str, Any] = {}
        if self.tokens is not None:
            extra["token"], extra["existing"] = self.tokens(storage)
        ref = ["new", self.attach(storage, **extra)]
        if key is not None:
            self._index[key] = ref
        return ref

    def attach(self, storage: torch.UntypedStorage, **extra: Any) -> int:
        """Attach a copy of `storage` (always a new entry); its index in `storages`."""
        if len(self.fds) >= MAX_FDS:
            raise ReplyTooLarge(f"more than {MAX_FDS} distinct tensor storages")
        self.total_bytes += storage.nbytes()
        if self.max_bytes is not None and self.total_bytes > self.max_bytes:
            raise ReplyTooLarge(f"more than {self.max_bytes} bytes of tensors")
        self.fds.append(write_storage(storage))
        self.storages.append({"nbytes": storage.nbytes(), "device": str(storage.device), **extra})
        self.keep.append(storage)
        return len(self.storages) - 1

    def tensor(self, value: torch.Tensor) -> dict[str, Any]:
        value = value.detach()
        return {"ref": self.storage_ref(value.untyped_storage()), "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape), "stride": list(value.stride()), "offset": value.storage_offset()}

    def close(self) -> None:
        _close_all(self.fds)
        self.fds = []


# ---------------------------------------------------------------------------------------------------------
# Values: pickled towards the child (trusted), a JSON tree towards the parent (untrusted)
# ---------------------------------------------------------------------------------------------------------
class _TensorPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, outbox: Outbox, token_of: Callable[[torch.Tensor], tuple[int, str]]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.outbox, self.token_of = outbox, token_of
        self.leaves: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        token, mode = self.token_of(obj)
        self.leaves.append(obj)
        spec = {} if mode == "reuse" else self.outbox.tensor(obj)
        return ("tensor", token, mode, spec, obj.requires_grad)


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, storages: Sequence[torch.UntypedStorage], held: dict[int, torch.Tensor]
                 ) -> None:
        super().__init__(file)
        self.storages, self.held = storages, held
        self.leaves: list[torch.Tensor] = []

    def persistent_load(self, pid: Any) -> Any:
        _, token, mode, spec, requires_grad = pid
        if mode == "reuse":
            tensor = self.held[token]
        else:
            tensor = _view(spec, self.storages[spec["ref"][1]])
            if requires_grad and tensor.is_floating_point():
                tensor.requires_grad_(True)
            previous = self.held.get(token)
            if mode == "update" and previous is not None and previous.shape == tensor.shape:
                with torch.no_grad():
                    previous.copy_(tensor)  # the same object, updated in place (its version counter moves)
                tensor = previous
            self.held[token] = tensor
        self.leaves.append(tensor)
        return tensor


def dump_inputs(value: Any, outbox: Outbox, token_of: Callable[[torch.Tensor], tuple[int, str]]
                ) -> tuple[str, list[torch.Tensor]]:
    """Pickle `value` (harness data for the child) with each tensor as a token and, unless `token_of` says the child
    holds it unchanged ("reuse"), its storage in `outbox`; latin-1 text and the tensors in pickling order."""
    buffer = io.BytesIO()
    pickler = _TensorPickler(buffer, outbox, token_of)
    pickler.dump(value)
    return buffer.getvalue().decode("latin-1"), pickler.leaves


def load_inputs(text: str, storages: Sequence[torch.UntypedStorage], held: dict[int, torch.Tensor]
                ) -> tuple[Any, list[torch.Tensor]]:
    """The child's side of `dump_inputs` (the parent is trusted): the value and its tensors in pickling order.
    `held` maps tokens to the tensors the child keeps for the parent (same object for the same parent tensor)."""
    unpickler = _TensorUnpickler(io.BytesIO(text.encode("latin-1")), storages, held)
    return unpickler.load(), unpickler.leaves


def encode_tree(value: Any, outbox: Outbox, depth: int = 0) -> Any:
    """A JSON tree of an output (the child's side); unknown objects become opaque markers."""
    if depth > MAX_DEPTH:
        raise WireError(f"output nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is torch.Tensor:
        return {"T": outbox.tensor(value)}
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if abs(value) < 1 << 63 else {"opaque": "int (out of range)"}
    if kind is float:
        return value if math.isfinite(value) else {"F": repr(value)}
    if kind in (tuple, list):
        return {kind.__name__: [encode_tree(v, outbox, depth + 1) for v in value]}
    if kind is torch.Size:
        return {"size": list(value)}
    if kind is dict and all(type(k) is str for k in value):
        return {"dict": [[k, encode_tree(v, outbox, depth + 1)] for k, v in value.items()]}
    if kind is torch.dtype:
        return {"dtype": str(value).removeprefix("torch.")}
    return {"opaque": f"{kind.__module__}.{kind.__qualname__}"[:200]}


class RemoteObject:
    """An object the candidate returned that cannot cross the channel as data; the oracle's structure check
    rejects it like any other unexpected type."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} returned by the sandboxed candidate>"


_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.bool, getattr(torch, "float8_e4m3fn", None),
    getattr(torch, "float8_e5m2", None), getattr(torch, "uint16", None), getattr(torch, "uint32", None),
    getattr(torch, "uint64", None)) if d is not None}


def _dtype(name: Any) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise WireError(f"unknown dtype {str(name)[:40]!r}")
    return _DTYPES[name]


def _ints(values: Any, what: str) -> list[int]:
    if (not isinstance(values, list) or len(values) > MAX_DIMS
            or not all(type(v) is int and 0 <= v < 1 << 62 for v in values)):
        raise WireError(f"bad tensor {what}")
    return values


def _view(spec: Any, storage: torch.UntypedStorage) -> torch.Tensor:
    """The tensor a spec describes on `storage`, after checking it lies inside the storage."""
    if not isinstance(spec, dict):
        raise WireError("bad tensor spec")
    dtype = _dtype(spec.get("dtype"))
    shape, stride = _ints(spec.get("shape"), "shape"), _ints(spec.get("stride"), "strides")
    offset = spec.get("offset")
    if len(shape) != len(stride) or type(offset) is not int or offset < 0:
        raise WireError("bad tensor layout")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if math.prod(shape):
        end = (offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * itemsize
        if end > storage.nbytes():
            raise WireError(f"a tensor view reaches byte {end} of a storage of {storage.nbytes()}")
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)


def decode_tree(node: Any, storage_of: Callable[[Any], torch.UntypedStorage]) -> Any:
    """The parent's side of `encode_tree`: `storage_of(ref)` resolves a tensor's storage reference."""
    leaves = [0]

    def walk(item: Any, depth: int) -> Any:
        leaves[0] += 1
        if depth > MAX_DEPTH or leaves[0] > MAX_LEAVES:
            raise WireError("output too deep or too large")
        if item is None or type(item) in (bool, int, float, str):
            return item
        if not isinstance(item, dict) or len(item) != 1:
            raise WireError("bad output node")
        (tag, body), = item.items()
        if tag == "T":
            return _view(body, storage_of(body.get("ref") if isinstance(body, dict) else None))
        if tag in ("tuple", "list") and isinstance(body, list):
            items = [walk(v, depth + 1) for v in body]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and isinstance(body, list):
            if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in body):
                raise WireError("bad dict node")
            return {k: walk(v, depth + 1) for k, v in body}
        if tag == "size":
            return torch.Size(_ints(body, "size"))
        if tag == "dtype":
            return _dtype(body)
        if tag == "F" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "opaque" and isinstance(body, str):
            return RemoteObject(body[:200])
        raise WireError(f"unknown output node {str(tag)[:40]!r}")

    return walk(node, 0)


def iter_tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a pickled-or-decoded value (tuples, lists, dict values)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from iter_tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors_in(item)
