"""The demo's incident on the secured broker with every component as its own Kafka
principal (admin provisions; tools and the approver publish as `tool`, the worker as
`worker`, the controller and the relay as themselves): the least-privilege ACLs are
enough for the whole pipeline, and the outcome is the plaintext demo's."""

from __future__ import annotations

import io
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from ops.demo import run_demo
from ops.demo_scenarios import SCENARIOS
from ops.runtime import Services
from producers import acl_bindings
from schemas import KAFKA_PRINCIPALS, TopicNames, kafka_config
from tests.support.services import SecuredBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def names(secured_kafka: SecuredBroker) -> Iterator[TopicNames]:
    """Topic names of this test's own; the demo creates the topics, this deletes them."""
    suffix = uuid.uuid4().hex[:8]
    chosen = TopicNames(**{s: f"t-demo-secured-{s}-{suffix}" for s in TopicNames.model_fields})
    yield chosen
    admin = AdminClient(
        kafka_config(secured_kafka.bootstrap, secured_kafka.security.client("admin"))
    )
    for future in admin.delete_topics(list(chosen.all()), operation_timeout=30).values():
        future.result(timeout=30)


def test_demo_runs_with_one_least_privileged_principal_per_component(
    secured_kafka: SecuredBroker, database_url: str, names: TopicNames
) -> None:
    principals = {
        component: secured_kafka.security.client(component)
        for component in KAFKA_PRINCIPALS
        if component != "broker"
    }
    services = Services(secured_kafka.bootstrap, database_url, kafka=principals)
    progress = io.StringIO()

    report = run_demo(services, progress, topics=names, timeout=150)

    log = progress.getvalue()
    assert report.ok, log[-4000:]
    assert "(SASL_SSL as admin (SCRAM-SHA-512))" in log
    assert f"kafka ACLs: {len(acl_bindings(names))} bindings" in log
    by_name = {op.scenario: op for op in report.operations}
    for scenario in SCENARIOS:
        op = by_name[scenario.name]
        assert op.state == scenario.final_state
        assert tuple(op.path) == scenario.path
        assert Counter(op.commands) == Counter(scenario.commands)
