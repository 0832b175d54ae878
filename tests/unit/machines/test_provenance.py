"""Pinning and signatures: a machine loads only when valid, pinned by digest and signed by a
trusted publisher, and each failing check is named by its own code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import CATALOGUE, Registry, load_machine, load_registry
from machines.errors import Code, ProvenanceError
from machines.loader import catalogue_packages
from machines.provenance import (
    LockFile,
    TrustedPublishers,
    dump_model,
    load_lock,
    load_locked_machines,
    load_pinned_machine,
    load_trusted_publishers,
    lock_entry,
    public_key_text,
    sign_machine,
)

PUBLISHER = "acme-recovery"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def package(tmp_path: Path) -> Path:
    target = tmp_path / "machines" / "procurement-request"
    shutil.copytree(CATALOGUE / "procurement-request", target)
    (target / "RECOVERY.sig").unlink()
    return target


def _trust(key: Ed25519PrivateKey, publisher: str = PUBLISHER) -> TrustedPublishers:
    return TrustedPublishers.model_validate(
        {"publishers": {publisher: {"keys": [public_key_text(key.public_key())]}}}
    )


def _pin_and_sign(
    package: Path, registry: Registry, key: Ed25519PrivateKey, publisher: str = PUBLISHER
) -> Path:
    machine = load_machine(package, registry)
    lock_path = package.parent / "machines.lock"
    entry = lock_entry(machine, PUBLISHER, package, lock_path.parent)
    lock = LockFile(lock_version=1, machines={f"{machine.name}@{machine.version}": entry})
    lock_path.write_text(dump_model(lock))
    (package / "RECOVERY.sig").write_text(dump_model(sign_machine(machine, publisher, key)))
    return lock_path


def _refusal(package: Path, registry: Registry, lock: Path, trust: TrustedPublishers) -> Code:
    with pytest.raises(ProvenanceError) as caught:
        load_pinned_machine(package, registry, lock, trust)
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].hint
    return caught.value.problems[0].code


def test_pinned_and_signed_machine_loads(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    machine = load_pinned_machine(package, registry, lock, _trust(key))
    assert machine.name == "procurement-request"
    assert load_lock(lock).machines["procurement-request@1.0.0"].digest == machine.digest


def test_unpinned_machine_is_refused_as_pin_missing(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    lock.write_text(dump_model(LockFile(lock_version=1)))
    assert _refusal(package, registry, lock, _trust(key)) is Code.PIN_MISSING


def test_edited_machine_is_refused_as_pin_digest_mismatch(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    text = (package / "RECOVERY.yaml").read_text()
    (package / "RECOVERY.yaml").write_text(text.replace("retention_days: 400", "retention_days: 1"))
    assert _refusal(package, registry, lock, _trust(key)) is Code.PIN_DIGEST_MISMATCH


def test_reformatted_machine_keeps_its_digest_and_still_loads(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    text = (package / "RECOVERY.yaml").read_text()
    reformatted = text.replace(
        "tools: [coupa, sap-ariba]", "tools:\n    - 'coupa'\n    - sap-ariba"
    )
    assert reformatted != text
    (package / "RECOVERY.yaml").write_text("# a new comment\n" + reformatted)
    assert load_pinned_machine(package, registry, lock, _trust(key)).name == "procurement-request"


def test_missing_signature_is_refused_as_signature_missing(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    (package / "RECOVERY.sig").unlink()
    assert _refusal(package, registry, lock, _trust(key)) is Code.SIGNATURE_MISSING


def test_signature_by_untrusted_key_is_refused_as_signature_invalid(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, Ed25519PrivateKey.generate())
    assert _refusal(package, registry, lock, _trust(key)) is Code.SIGNATURE_INVALID


def test_tampered_signature_bytes_are_refused_as_signature_invalid(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    data = json.loads((package / "RECOVERY.sig").read_text())
    data["signature"] = ("A" if data["signature"][0] != "A" else "B") + data["signature"][1:]
    (package / "RECOVERY.sig").write_text(json.dumps(data))
    assert _refusal(package, registry, lock, _trust(key)) is Code.SIGNATURE_INVALID


def test_signature_by_another_publisher_is_refused_as_publisher_mismatch(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key, publisher="someone-else")
    assert _refusal(package, registry, lock, _trust(key)) is Code.PUBLISHER_MISMATCH


def test_publisher_without_trusted_key_is_refused_as_publisher_untrusted(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    assert _refusal(package, registry, lock, _trust(key, "other")) is Code.PUBLISHER_UNTRUSTED


def test_garbage_signature_file_is_refused_as_signature_malformed(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    (package / "RECOVERY.sig").write_text('{"signature": 1}')
    assert _refusal(package, registry, lock, _trust(key)) is Code.SIGNATURE_MALFORMED


def test_malformed_lock_file_is_refused_as_lock_invalid(tmp_path: Path) -> None:
    lock = tmp_path / "machines.lock"
    lock.write_text('{"lock_version": 1, "machines": {"a@1.0.0": {"name": "b"}}}')
    with pytest.raises(ProvenanceError) as caught:
        load_lock(lock)
    assert caught.value.codes == (Code.LOCK_INVALID,)


def test_trust_config_with_short_key_is_refused(tmp_path: Path) -> None:
    trust = tmp_path / "trust.yaml"
    trust.write_text("publishers:\n  acme:\n    keys: [AAAA]\n")
    with pytest.raises(ProvenanceError) as caught:
        load_trusted_publishers(trust)
    assert caught.value.codes == (Code.TRUST_CONFIG_INVALID,)


def test_shipped_catalogue_is_pinned_and_signed_by_its_publisher(registry: Registry) -> None:
    trust = load_trusted_publishers(CATALOGUE.parent / "trusted-publishers.yaml")
    lock = CATALOGUE.parent / "machines.lock"
    pinned = load_lock(lock).machines
    packages = list(catalogue_packages())
    for package in packages:
        machine = load_pinned_machine(package, registry, lock, trust)
        assert pinned[f"{machine.name}@{machine.version}"].digest == machine.digest
    assert len(pinned) == len(packages) >= 5


def test_load_locked_machines_loads_every_pinned_catalogue_machine(registry: Registry) -> None:
    trust = load_trusted_publishers(CATALOGUE.parent / "trusted-publishers.yaml")
    machines = load_locked_machines(CATALOGUE.parent / "machines.lock", registry, trust)
    assert set(machines) == {f"{p.name}@1.0.0" for p in catalogue_packages()}


def test_load_locked_machines_names_an_entry_pointing_at_another_machine(
    package: Path, registry: Registry, key: Ed25519PrivateKey
) -> None:
    lock = _pin_and_sign(package, registry, key)
    other = package.parent / "email-send"
    shutil.copytree(CATALOGUE / "email-send", other)
    data = json.loads(lock.read_text())
    data["machines"]["procurement-request@1.0.0"]["path"] = "email-send"
    lock.write_text(json.dumps(data))
    with pytest.raises(ProvenanceError) as caught:
        load_locked_machines(lock, registry, _trust(key))
    assert caught.value.codes == (Code.PIN_MISSING,)


def test_a_lock_pins_several_versions_and_marks_the_one_new_operations_open_on(
    tmp_path: Path, registry: Registry
) -> None:
    from tests.support.rollout import signed_lock

    signed = signed_lock(
        tmp_path, [("email-send", "1.0.0", None), ("email-send", "2.0.0", None)],
        {"email-send": "2.0.0"},
    )  # fmt: skip
    pins = load_locked_machines(signed.lock, registry, load_trusted_publishers(signed.trust))
    assert sorted(pins) == ["email-send@1.0.0", "email-send@2.0.0"]
    current = pins.current("email-send")
    assert current is not None
    assert current.version == "2.0.0"
    assert pins.by_digest(pins["email-send@1.0.0"].digest) is pins["email-send@1.0.0"]


def test_a_lock_pinning_two_versions_without_a_current_one_is_refused(tmp_path: Path) -> None:
    from tests.support.rollout import signed_lock

    signed = signed_lock(tmp_path, [("email-send", "1.0.0", None), ("email-send", "2.0.0", None)])
    data = json.loads(signed.lock.read_text())
    del data["current"]
    signed.lock.write_text(json.dumps(data))
    with pytest.raises(ProvenanceError, match="none is marked current") as caught:
        load_lock(signed.lock)
    assert caught.value.problems[0].code == Code.LOCK_INVALID
    data["current"] = {"email-send": "3.0.0"}
    signed.lock.write_text(json.dumps(data))
    with pytest.raises(ProvenanceError, match=r"3\.0\.0 is not pinned"):
        load_lock(signed.lock)
