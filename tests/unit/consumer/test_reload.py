"""Reloading the rules without a restart (`consumer.reload`): on request or when a
watched file changed, between batches; the old rules kept when the new ones do not
load; every change, and every refused one, recorded on the group's rules chain."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from consumer import Controller, ControllerError, ControllerSettings, RulesWatch, rules_chain_id
from consumer.reload import ReloadRequests
from ledger import MemoryLedger
from machines import Pins, Policy, Rules
from ops.commands.replay import recorded_policies
from tests.support.producers import with_roster
from tests.unit.consumer.support import GROUP, pinned


def _rules(policy_id: str) -> tuple[Pins, Rules]:
    machines, rules = pinned()
    return Pins(machines), Rules(policy=with_roster(Policy(id=policy_id)), registry=rules.registry)


def _controller(
    ledger: MemoryLedger, load: Callable[[], tuple[Pins, Rules]], watch: RulesWatch
) -> Controller:
    pins, rules = _rules("before")
    settings = ControllerSettings(bootstrap="unused:9092", database_url="unused", group_id=GROUP)
    return Controller(settings, ledger, machines=pins, rules=rules, reload=load, watch=watch)


def test_a_requested_reload_swaps_the_rules_and_audits_old_and_new_digests() -> None:
    requests, ledger = ReloadRequests(), MemoryLedger()
    controller = _controller(ledger, lambda: _rules("after"), RulesWatch((), 0, requests=requests))
    before = controller.rules.policy.digest
    controller._maybe_reload()  # nothing asked
    assert controller.rules.policy.id == "before"
    requests.request("SIGHUP to pid 7")
    controller._maybe_reload()
    assert controller.rules.policy.id == "after"
    (record,), head = ledger.audit_chain(rules_chain_id(GROUP))
    body = record.record
    assert body["kind"] == "rules-changed"
    assert body["trigger"] == "SIGHUP to pid 7"
    assert body["old"]["policy"] == {"id": "before", "digest": before}
    assert body["new"]["policy"] == {"id": "after", "digest": controller.rules.policy.digest}
    assert body["changed"] == ["policy"]
    assert head is not None
    assert ledger.verify_audit() == ()
    # The audit record is signed for recovery.audit like every other.
    (row,) = ledger.audit_outbox(rules_chain_id(GROUP))
    assert row.record.value is not None
    # Both policies are kept, for `replay --verify` to decide again under either.
    assert set(recorded_policies(ledger)) == {before, controller.rules.policy.digest}


def test_rules_that_do_not_load_are_refused_and_the_old_ones_kept() -> None:
    requests, ledger = ReloadRequests(), MemoryLedger()

    def broken() -> tuple[Pins, Rules]:
        raise ControllerError("policy /etc/policy.yaml: line 3: approvers: not a list")

    controller = _controller(ledger, broken, RulesWatch((), 0, requests=requests))
    requests.request("SIGHUP")
    controller._maybe_reload()
    assert controller.rules.policy.id == "before"
    (record,), _ = ledger.audit_chain(rules_chain_id(GROUP))
    assert record.record["kind"] == "rules-change-refused"
    assert "line 3" in record.record["error"]
    assert record.record["new"] is None


def test_an_unchanged_reload_records_nothing() -> None:
    requests, ledger = ReloadRequests(), MemoryLedger()
    controller = _controller(ledger, lambda: _rules("before"), RulesWatch((), 0, requests=requests))
    requests.request("SIGHUP")
    controller._maybe_reload()
    assert ledger.audit_chain(rules_chain_id(GROUP)) == ((), None)


def test_the_watch_sees_a_changed_file_at_its_interval(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("id: one\n")
    now = [0.0]
    watch = RulesWatch([policy, None], 5.0, requests=ReloadRequests(), clock=lambda: now[0])
    assert watch.due() is None
    policy.write_text("id: two\n")
    assert watch.due() is None  # not yet: the interval bounds the reads
    now[0] = 6.0
    found = watch.due()
    assert found is not None
    assert str(policy) in found
    now[0] = 12.0
    assert watch.due() is None  # seen
    policy.touch()
    now[0] = 18.0
    assert watch.due() is None  # the same content


@pytest.mark.parametrize("interval", [0.0])
def test_without_an_interval_only_requests_reload(tmp_path: Path, interval: float) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("id: one\n")
    requests = ReloadRequests()
    watch = RulesWatch([policy], interval, requests=requests, clock=lambda: 1e9)
    policy.write_text("id: two\n")
    assert watch.due() is None
    requests.request("SIGHUP")
    assert watch.due() == "SIGHUP"
    assert watch.due() is None


def test_a_reload_that_unpins_a_version_warns_that_its_operations_would_be_stranded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    requests, ledger = ReloadRequests(), MemoryLedger()
    machines, rules = _rules("before")
    fewer = Pins({k: m for k, m in machines.items() if k != "email-send@1.0.0"})
    controller = _controller(ledger, lambda: (fewer, rules), RulesWatch((), 0, requests=requests))
    requests.request("SIGHUP")
    controller._maybe_reload()
    assert "no longer pins email-send@1.0.0" in caplog.text
    (record,), _ = ledger.audit_chain(rules_chain_id(GROUP))
    assert record.record["changed"] == ["current", "lock_digest", "machines"]
