"""`recoveryctl machines lock|promote` keep one current version per machine, and
`machines rollout` counts operations in flight per version (no services: the counts
are given as the ledger returns them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import MachineStateCount
from machines import DEFAULT_REGISTRY, load_lock, load_locked_machines, load_trusted_publishers
from machines import load_registry as load_machine_registry
from ops.cli import main
from ops.commands.machines import rollout_rows
from tests.support.rollout import package, signed_lock


def test_locking_a_new_version_keeps_the_current_one_until_it_is_promoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    signed = signed_lock(tmp_path, [("email-send", "1.0.0", None)])
    v2 = package(tmp_path, signed.key, "email-send", "2.0.0", None)
    lock = str(signed.lock)
    assert main(["machines", "lock", str(v2), "--lock", lock, "--publisher", "rollout-tests"]) == 0
    assert "current email-send@1.0.0" in capsys.readouterr().out
    pinned = load_lock(signed.lock)
    assert sorted(pinned.machines) == ["email-send@1.0.0", "email-send@2.0.0"]
    assert pinned.current == {"email-send": "1.0.0"}

    assert main(["machines", "promote", "email-send@2.0.0", "--lock", lock]) == 0
    assert "current email-send@2.0.0 (was 1.0.0)" in capsys.readouterr().out
    assert load_lock(signed.lock).current == {"email-send": "2.0.0"}
    pins = load_locked_machines(
        signed.lock,
        load_machine_registry(DEFAULT_REGISTRY),
        load_trusted_publishers(signed.trust),
    )
    current = pins.current("email-send")
    assert current is not None
    assert current.version == "2.0.0"

    assert main(["machines", "promote", "email-send@3.0.0", "--lock", lock]) == 2
    assert "email-send@3.0.0 is not pinned" in capsys.readouterr().err


def test_rollout_counts_in_flight_and_finished_operations_per_version(tmp_path: Path) -> None:
    signed = signed_lock(
        tmp_path, [("email-send", "1.0.0", None), ("email-send", "2.0.0", None)],
        {"email-send": "2.0.0"},
    )  # fmt: skip
    pins = load_locked_machines(
        signed.lock,
        load_machine_registry(DEFAULT_REGISTRY),
        load_trusted_publishers(signed.trust),
    )
    v1, v2 = pins["email-send@1.0.0"], pins["email-send@2.0.0"]
    counts = [
        MachineStateCount("email-send", "1.0.0", v1.digest, "unresolved", 3),
        MachineStateCount("email-send", "1.0.0", v1.digest, "abandoned", 2),
        MachineStateCount("email-send", "2.0.0", v2.digest, "containing", 1),
        MachineStateCount("email-send", "0.9.0", "sha256:old", "resumed", 4),
    ]
    rows = {r["version"]: r for r in rollout_rows(pins, counts)}
    assert (rows["1.0.0"]["in_flight"], rows["1.0.0"]["finished"]) == (3, 2)
    assert (rows["1.0.0"]["pinned"], rows["1.0.0"]["current"]) == (True, False)
    assert (rows["2.0.0"]["in_flight"], rows["2.0.0"]["current"]) == (1, True)
    # A version the lock no longer pins: its final states are unknown here, so every
    # operation on it counts as in flight (stranded).
    assert (rows["0.9.0"]["pinned"], rows["0.9.0"]["in_flight"]) == (False, 4)
