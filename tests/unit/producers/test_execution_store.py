"""The worker's execution store: a claim is taken once, an answer survives reopening,
and the start position of a new group parses only what it documents."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from machines import EvidencePayload
from producers import (
    ENV_WORKER_STORE,
    ENV_WORKER_STORE_URL,
    ExecutionState,
    ExecutionStore,
    PostgresExecutionStore,
    ProducersError,
    StartPosition,
    StoredAnswer,
    open_execution_store,
)


def test_a_command_id_is_claimed_once_and_its_answer_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "executions.sqlite"
    answer = StoredAnswer(
        reported=True,
        succeeded=True,
        evidence=EvidencePayload(outcome="applied", reference="coupa-status:REQ-1"),
        evidence_ref="coupa:request:REQ-1",
        completed_at=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
    )
    with ExecutionStore(path) as store:
        assert store.lookup("op-1:2:0") is None
        assert store.claim("op-1:2:0", "procurement.create-request")
        assert not store.claim("op-1:2:0", "procurement.create-request")
        claimed = store.lookup("op-1:2:0")
        assert claimed is not None
        assert (claimed.state, claimed.answer) == (ExecutionState.CLAIMED, None)
        store.record("op-1:2:0", answer)
        assert store.claim("op-1:3:0", "procurement.verify-request")
    with ExecutionStore(path) as reopened:
        done = reopened.lookup("op-1:2:0")
        assert done is not None
        assert done.state is ExecutionState.DONE
        assert done.answer == answer
        assert reopened.counts() == {"claimed": 1, "done": 1}
        with pytest.raises(ProducersError, match="no claim"):
            reopened.record("op-1:2:0", answer)  # done already: never overwritten


def test_a_store_is_required_from_the_environment_when_none_is_passed() -> None:
    with pytest.raises(ProducersError, match=ENV_WORKER_STORE):
        ExecutionStore.from_env({})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", StartPosition("latest")),
        ("earliest", StartPosition("earliest")),
        (
            "2026-12-01T09:00:00+01:00",
            StartPosition("timestamp", datetime(2026, 12, 1, 8, 0, tzinfo=UTC)),
        ),
    ],
)
def test_a_start_position_is_latest_earliest_or_an_aware_time(
    text: str, expected: StartPosition
) -> None:
    assert StartPosition.parse(text) == expected


@pytest.mark.parametrize("text", ["beginning", "2026-12-01T09:00:00", ""])
def test_any_other_start_position_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ProducersError, match="latest, earliest or an ISO 8601"):
        StartPosition.parse(text)


def test_the_default_start_position_is_latest() -> None:
    assert StartPosition.from_env({}) == StartPosition("latest")


def test_a_failures_retry_after_survives_reopening_and_old_answers_read_without_it(
    tmp_path: Path,
) -> None:
    limited = StoredAnswer(reported=True, succeeded=False, retry_after_seconds=90)
    with ExecutionStore(tmp_path / "executions.sqlite") as store:
        assert store.claim("op-1:3:0", "payment.create-refund")
        store.record("op-1:3:0", limited)
    with ExecutionStore(tmp_path / "executions.sqlite") as reopened:
        done = reopened.lookup("op-1:3:0")
        assert done is not None
        assert done.answer == limited
    # An answer stored before the field was kept.
    old = StoredAnswer.from_json('{"reported": true, "succeeded": false}')
    assert old.retry_after_seconds is None


def test_the_shared_store_wins_when_its_url_is_set(tmp_path: Path) -> None:
    environ = {
        ENV_WORKER_STORE: str(tmp_path / "executions.sqlite"),
        ENV_WORKER_STORE_URL: "postgresql://recovery_worker@db-1:5432,db-2:5432/recovery",
    }
    store = open_execution_store(environ)  # connects on first use, not here
    assert isinstance(store, PostgresExecutionStore)
    local = open_execution_store({ENV_WORKER_STORE: str(tmp_path / "executions.sqlite")})
    assert isinstance(local, ExecutionStore)
    local.close()


def test_no_store_at_all_names_both_variables() -> None:
    with pytest.raises(ProducersError, match=f"{ENV_WORKER_STORE}.*{ENV_WORKER_STORE_URL}"):
        open_execution_store({})
