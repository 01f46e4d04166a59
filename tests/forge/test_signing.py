"""Signed plans (issue 9, items 4 and 5): a plan carrying generated code loads only with a valid HMAC under the
user's key, the signature covers the whole document, `kforge plan sign/show/verify` report who signed, and
`plan verify` runs a generated kernel in the sandbox before any other process imports it.

Plans are real files written by `KernelOptimizationPlan.save`; tampering edits the JSON as an attacker would
(replacing the source and recomputing `source_sha256`, deleting the hash). The CLI runs through `kforge.cli.main`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from forge.outcome import Outcome
from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError
from forge.samples import Sample
from forge.signing import (
    SignatureStatus,
    SigningKey,
    check_document,
    load_key,
    sign_document,
)
from forge.verify import VerifySettings, verify_plan_file
from kforge.cli import main
from tests.agent.kernels import SILU_HANG, SILU_OK, SILU_WRONG
from tests.forge.providers_for_tests import FastGeluProvider


def _silu_sample() -> Sample:
    return Sample((torch.randn(64),), {"inplace": False})


def _generated_plan(path: Path, source: str = SILU_OK) -> Path:
    from agent.provider import GeneratedKernelProvider

    sample = _silu_sample()
    provider = GeneratedKernelProvider("silu", source, language="triton", signatures=[sample], metadata={"model": "m"},
                                       cache_dir=path.parent / "cache")
    provider._ready = True  # nothing imported here
    return KernelOptimizationPlan(entries=(PlanEntry(provider, (sample,), source="generated"),)).save(path)


def _static_plan(path: Path) -> Path:
    x = torch.randn(64)
    gelu = FastGeluProvider()
    assert gelu.prepare([Sample((x,), {})])
    return KernelOptimizationPlan(entries=(PlanEntry(gelu, (Sample((x,), {}),)),)).save(path)


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _replace_source(data: dict) -> None:
    provider = data["entries"][0]["provider"]
    provider["source"] = SILU_WRONG  # screens clean: only the signature can tell
    provider["source_sha256"] = hashlib.sha256(SILU_WRONG.encode()).hexdigest()


# -- round trip, and what the signature covers -------------------------------------------------------------------
def test_a_saved_generated_plan_is_signed_and_loads(tmp_path) -> None:
    path = _generated_plan(tmp_path / "plan.json")
    block = json.loads(path.read_text())["signature"]
    key = load_key()
    assert block["signer"] == "tests@kforge" and block["key_id"] == key.key_id and len(block["mac"]) == 64
    plan = KernelOptimizationPlan.load(path)
    assert plan.signature.status is SignatureStatus.VALID and plan.signature.signer == "tests@kforge"
    assert plan.entries[0].provider.source == SILU_OK


@pytest.mark.parametrize("tamper", [
    _replace_source,
    lambda d: d["entries"][0]["provider"].pop("source_sha256"),
    lambda d: d["entries"][0]["provider"].__setitem__("entry_point", "other"),
    lambda d: d["entries"][0]["provider"]["metadata"].__setitem__("model", "trusted-model"),
    lambda d: d["entries"][0]["signatures"][0]["args"][0]["tensor"]["shape"].__setitem__(0, 65),
    lambda d: d["entries"][0].__setitem__("latency_ms", 0.001),
    lambda d: d["signature"].__setitem__("signer", "admin@prod"),
], ids=["source+sha", "sha-deleted", "entry-point", "metadata", "signatures", "latency", "signer-claim"])
def test_any_edit_after_signing_is_refused_at_load(tmp_path, tamper) -> None:
    path = _generated_plan(tmp_path / "plan.json")
    _edit(path, tamper)
    with pytest.raises(PlanLoadError, match=r"generated code \(silu\); signature: signature does not match") as info:
        KernelOptimizationPlan.load(path)
    assert f"kforge plan sign {path}" in str(info.value) and "trust_unsigned=True" in str(info.value)


def test_a_plan_signed_with_another_key_is_refused(tmp_path, monkeypatch) -> None:
    path = _generated_plan(tmp_path / "plan.json")
    monkeypatch.setenv("KFORGE_SIGNING_KEY", "someone-else's key")
    with pytest.raises(PlanLoadError, match="signed with another key: claims by tests@kforge"):
        KernelOptimizationPlan.load(path)


def test_an_unsigned_generated_plan_is_refused_and_loads_only_when_trusted(tmp_path, monkeypatch, caplog) -> None:
    path = _generated_plan(tmp_path / "plan.json")
    _edit(path, lambda d: d.pop("signature"))
    with pytest.raises(PlanLoadError, match=r"plan file .*plan.json: .*signature: unsigned\. Nothing was imported"):
        KernelOptimizationPlan.load(path)
    _edit(path, _replace_source)
    with caplog.at_level(logging.WARNING, logger="forge.plan"):
        plan = KernelOptimizationPlan.load(path, trust_unsigned=True)
    assert plan.entries[0].provider.source == SILU_WRONG
    assert "loading it anyway because trust_unsigned=True" in caplog.text


def test_without_a_key_save_writes_unsigned_with_a_warning_and_load_refuses(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    with caplog.at_level(logging.WARNING, logger="forge.plan"):
        path = _generated_plan(tmp_path / "plan.json")
    assert "saved unsigned" in caplog.text and "signature" not in json.loads(path.read_text())
    with pytest.raises(PlanLoadError, match="no signing key here"):
        KernelOptimizationPlan.load(path)


def test_static_only_plans_load_unsigned_without_any_key(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    path = _static_plan(tmp_path / "plan.json")
    assert "signature" not in json.loads(path.read_text())
    plan = KernelOptimizationPlan.load(path)
    assert plan.functions == ["gelu"] and plan.signature.status is SignatureStatus.UNSIGNED
    assert not Path(os.environ["KFORGE_SIGNING_KEY_FILE"]).exists()  # loading never creates a key


@pytest.mark.parametrize(("block", "where"), [
    ({"algorithm": "hmac-sha256", "signer": "a", "key_id": "0" * 8, "signed_at": "t", "mac": 7}, "signature.mac"),
    ({"algorithm": "hmac-sha256", "signer": "a", "key_id": "xyz", "signed_at": "t", "mac": "0" * 64},
     "signature.key_id"),
    ({"algorithm": "hmac-sha256", "signer": "a", "key_id": "0" * 8, "mac": "0" * 64}, "missing key 'signed_at'"),
    ("signed", "signature: must be an object"),
])
def test_the_schema_checks_the_signature_block(tmp_path, block, where) -> None:
    path = _generated_plan(tmp_path / "plan.json")
    _edit(path, lambda d: d.__setitem__("signature", block))
    with pytest.raises(PlanLoadError, match=where):
        KernelOptimizationPlan.load(path)


# -- keys ------------------------------------------------------------------------------------------------------
def test_keys_from_hex_or_text_and_a_private_key_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_SIGNING_KEY", "ab" * 16)
    assert load_key().secret == bytes.fromhex("ab" * 16)
    monkeypatch.setenv("KFORGE_SIGNING_KEY", "a passphrase")
    assert load_key().secret == b"a passphrase"
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    assert load_key() is None
    created = load_key(create=True)
    path = Path(os.environ["KFORGE_SIGNING_KEY_FILE"])
    assert created.created and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key().secret == created.secret and not load_key().created
    path.chmod(0o644)
    with pytest.raises(ValueError, match="accessible by other users"):
        load_key()
    assert "secret" not in repr(created) and created.secret.hex() not in repr(created)


def test_check_document_statuses() -> None:
    key, other = SigningKey(b"k1", "test"), SigningKey(b"k2", "test")
    signed = sign_document({"a": 1.5, "b": [1, "x"]}, key, signer="me")
    reread = json.loads(json.dumps(signed, indent=2))
    assert check_document(reread, key).valid
    assert check_document(reread, other).status is SignatureStatus.OTHER_KEY
    assert check_document(reread, None).status is SignatureStatus.NO_KEY
    assert check_document({**reread, "a": 1.25}, key).status is SignatureStatus.INVALID
    assert check_document({"a": 1}, key).status is SignatureStatus.UNSIGNED
    assert check_document({**reread, "signature": {"mac": "x"}}, key).status is SignatureStatus.MALFORMED


# -- the CLI -----------------------------------------------------------------------------------------------------
def test_cli_sign_creates_a_key_then_show_and_verify_report_the_signer(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    monkeypatch.setenv("KFORGE_SIGNER", "alice\x1b[31m@box")  # a signer name must not drive the terminal
    path = _generated_plan(tmp_path / "plan.json")  # no key yet: unsigned
    assert main(["plan", "show", str(path)]) == 2
    assert f"kforge plan sign {path}" in capsys.readouterr().err
    assert main(["plan", "show", "--trust-unsigned", str(path)]) == 0
    assert "signature: unsigned (loaded because of --trust-unsigned)" in capsys.readouterr().out

    assert main(["plan", "sign", str(path)]) == 0
    out = capsys.readouterr().out
    key = load_key()
    assert f"created a new signing key in {os.environ['KFORGE_SIGNING_KEY_FILE']}" in out
    assert f"signed {path} as alice\\x1b[31m@box (key {key.key_id}" in out and "\x1b" not in out

    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"signature: signed by alice\\x1b[31m@box (key {key.key_id}" in out and "\x1b" not in out

    _edit(path, _replace_source)
    assert main(["plan", "verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "signature does not match" in err and f"kforge plan sign {path}" in err


def test_cli_sign_refuses_a_plan_that_fails_screening(tmp_path, capsys) -> None:
    from tests.agent.kernels import SILU_FORBIDDEN

    path = _generated_plan(tmp_path / "plan.json", SILU_FORBIDDEN)
    _edit(path, lambda d: d.pop("signature"))
    assert main(["plan", "sign", str(path)]) == 2
    assert "fails screening" in capsys.readouterr().err
    assert "signature" not in json.loads(path.read_text())


# -- plan verify runs generated kernels in the sandbox first ------------------------------------------------------
def _spy_child(monkeypatch) -> list[str]:
    import forge.verify

    started: list[str] = []
    original = forge.verify._verify_entry

    def spy(path, index, function, modules, settings):
        started.append(function)
        return original(path, index, function, modules, settings)

    monkeypatch.setattr(forge.verify, "_verify_entry", spy)
    return started


def test_verify_runs_a_generated_kernel_in_the_sandbox_and_a_wrong_one_never_leaves_it(tmp_path, monkeypatch) -> None:
    started = _spy_child(monkeypatch)
    wrong = verify_plan_file(_generated_plan(tmp_path / "wrong.json", SILU_WRONG))
    assert [r.status for r in wrong] == [Outcome.MISMATCH]
    assert started == []  # the verifying child (which imports the kernel unsandboxed) was never started
    ok = verify_plan_file(_generated_plan(tmp_path / "ok.json", SILU_OK))
    assert [r.status for r in ok] == [Outcome.OK] and started == ["silu"]


def test_verify_stops_a_spinning_kernel_in_the_sandbox(tmp_path, monkeypatch) -> None:
    started = _spy_child(monkeypatch)
    settings = VerifySettings(timeout_s=1, sandbox_startup_s=15)
    result, = verify_plan_file(_generated_plan(tmp_path / "hang.json", SILU_HANG), settings)
    assert result.status is Outcome.TIMEOUT and "sandbox start-up" in result.errors[0]
    assert started == []


def test_verify_refuses_to_run_a_generated_kernel_without_the_sandbox(tmp_path, monkeypatch) -> None:
    from forge.sandbox.isolation import UNSAFE_ENV, reset_probes

    path = _generated_plan(tmp_path / "plan.json")
    started = _spy_child(monkeypatch)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no bwrap
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    reset_probes()
    try:
        result, = verify_plan_file(path)
    finally:
        reset_probes()
    assert result.status is Outcome.HARNESS_ERROR and "sandbox cannot be set up" in result.errors[0]
    assert started == []


def test_verify_refuses_a_code_carrying_provider_that_gives_the_judge_no_code(tmp_path, monkeypatch) -> None:
    from agent.provider import GeneratedKernelProvider

    path = _generated_plan(tmp_path / "plan.json")
    started = _spy_child(monkeypatch)
    monkeypatch.setattr(GeneratedKernelProvider, "candidate_code", lambda self: None)
    result, = verify_plan_file(path)
    assert result.status is Outcome.HARNESS_ERROR and "gives the judge none to sandbox" in result.errors[0]
    assert started == []


def test_static_providers_skip_the_sandbox(tmp_path, monkeypatch) -> None:
    started = _spy_child(monkeypatch)
    result, = verify_plan_file(_static_plan(tmp_path / "plan.json"))
    assert result.status is Outcome.OK and started == ["gelu"]


def test_optimize_reports_who_signed_the_saved_plan_or_how_to_sign_it(tmp_path, monkeypatch, capsys) -> None:
    from agent.provider import GeneratedKernelProvider
    from kforge.cli import _save_plan

    sample = _silu_sample()
    provider = GeneratedKernelProvider("silu", SILU_OK, language="triton", signatures=[sample])
    provider._ready = True
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider, (sample,), source="generated"),))
    _save_plan(plan, str(tmp_path / "signed.json"))
    assert f"plan signed by tests@kforge (key {load_key().key_id}" in capsys.readouterr().out
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    _save_plan(plan, str(tmp_path / "unsigned.json"))
    assert f"is unsigned: review it, then run `kforge plan sign {tmp_path / 'unsigned.json'}`" in \
        capsys.readouterr().out


def test_a_key_file_others_can_read_refuses_generated_plans_but_not_static_ones(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    assert load_key(create=True).created
    generated = _generated_plan(tmp_path / "generated.json")
    static = _static_plan(tmp_path / "static.json")
    Path(os.environ["KFORGE_SIGNING_KEY_FILE"]).chmod(0o640)
    with pytest.raises(PlanLoadError, match="cannot read the signing key: .*accessible by other users"):
        KernelOptimizationPlan.load(generated)
    assert KernelOptimizationPlan.load(static).functions == ["gelu"]
