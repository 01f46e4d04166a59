"""Test-wide setup: Triton kernels run on CPU tensors through the interpreter when there is no GPU; Python's own
SIGINT handler; a signing key.

Plans and kernel-cache entries carrying generated code must be signed (`forge.signing`): every test gets a test key
in `$KFORGE_SIGNING_KEY` (child processes inherit it) and a key-file path inside its temporary folder, so no test
reads or creates the user's `~/.config/kforge/signing.key`. Tests of the unsigned paths remove the variable.
"""

import os
import signal

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Ctrl-C as in a plain interpreter: pytest-xdist's workers start with SIGINT ignored, and the tests of contained
# interrupts (`forge.outcome.watch_interrupts`) send real SIGINTs.
signal.signal(signal.SIGINT, signal.default_int_handler)

TEST_SIGNING_KEY = "kforge-test-signing-key"


@pytest.fixture(autouse=True)
def signing_key(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The key plans and caches are signed with in tests (`$KFORGE_SIGNING_KEY`); the key file points nowhere."""
    monkeypatch.setenv("KFORGE_SIGNING_KEY", TEST_SIGNING_KEY)
    monkeypatch.setenv("KFORGE_SIGNING_KEY_FILE", str(tmp_path_factory.mktemp("signing") / "signing.key"))
    monkeypatch.setenv("KFORGE_SIGNER", "tests@kforge")
    return TEST_SIGNING_KEY
