"""`recoveryctl lineage` against PostgreSQL: the tree, JSON and text, and the exit
status for an unknown operation."""

from __future__ import annotations

import io
import json

import pytest

from ledger import PostgresLedger
from ops.cli import build_parser, execute
from tests.unit.ledger.ledger_support import GROUP, TOPIC, feed
from tests.unit.ledger.lineage_contract import tree_event

pytestmark = pytest.mark.integration


def _run(url: str, operation: str, *, as_json: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["lineage", operation, "--database-url", url, *(["--json"] if as_json else [])]
    return execute(build_parser().parse_args(argv), out, err), out.getvalue(), err.getvalue()


def test_lineage_prints_the_tree_of_a_descendant_with_commands(database_url: str) -> None:
    ledger = PostgresLedger(database_url, max_size=1)
    try:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(
            ledger,
            [
                tree_event("mid", 0, "STEP_FAILED", parent="root"),
                tree_event("leaf", 0, "STEP_FAILED", parent="mid"),
                tree_event("root", 0, "AUTHORIZATION_DENIED"),
            ],
            epoch=claim.epoch,
        )
    finally:
        ledger.close()
    status, out, _ = _run(database_url, "leaf", as_json=True)
    assert status == 0
    report = json.loads(out)
    assert [o["operation_id"] for o in report["operations"]] == ["root", "mid", "leaf"]
    leaf = report["operations"][2]
    assert leaf["contained_ancestors"] == ["root"]
    assert leaf["delegated_credentials"] == ["cred-leaf"]
    assert [c["capability"] for c in leaf["commands"]] == ["research.reconstruct-effects"]
    status, text, _ = _run(database_url, "root", as_json=False)
    assert status == 0
    assert "root *  [containing]" in text
    assert "    leaf  [reconstructing]" in text


def test_lineage_of_an_unknown_operation_exits_2_naming_it(database_url: str) -> None:
    status, out, err = _run(database_url, "no-such-op", as_json=False)
    assert (status, out) == (2, "")
    assert "no-such-op" in err
