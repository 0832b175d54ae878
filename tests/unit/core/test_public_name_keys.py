"""`machines.public_name_keys`: which keys of a policy anyone who knows a name can sign
with (issue 14, item 4). The controller's refusal on top of it is in
tests/unit/consumer/test_policy_refusal.py."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import insecure_test_key, load_policy, parse_policy, public_key_b64, public_name_keys

OPS = Path(__file__).resolve().parents[3] / "ops"


def _policy(approvers: dict[str, str], **fields: object):  # type: ignore[no-untyped-def]
    roster = [
        {"id": name, "public_key": key, "roles": ["recovery-approver"]}
        for name, key in approvers.items()
    ]
    return parse_policy({"id": "p", "approvers": roster, **fields})


def test_the_demo_policy_approver_key_is_found_with_the_name_it_comes_from() -> None:
    found = public_name_keys(load_policy(OPS / "demo_policy.yaml"))
    assert [(k.holder, k.name) for k in found] == [("approvers[approver-dana]", "approver-dana")]
    assert found[0].public_key == public_key_b64(insecure_test_key("approver-dana"))
    assert "insecure_test_key('approver-dana')" in found[0].describe()


def test_generated_keys_and_the_production_template_have_none() -> None:
    fresh = public_key_b64(Ed25519PrivateKey.generate())
    assert public_name_keys(_policy({"approver-jane": fresh})) == ()
    assert public_name_keys(load_policy(OPS / "policy.production.yaml")) == ()


def test_a_key_derived_from_any_other_name_in_the_policy_is_found() -> None:
    # Jane's key derives from a verifier's name, which anyone reading the policy knows.
    policy = _policy(
        {
            "approver-jane": public_key_b64(insecure_test_key("payment.verify-refund")),
            "approver-kim": public_key_b64(insecure_test_key("recovery-approver")),
            "approver-lee": public_key_b64(insecure_test_key("p")),  # the policy's id
            "approver-max": public_key_b64(Ed25519PrivateKey.generate()),
        },
        trusted_verifiers=["payment.verify-refund"],
    )
    found = {k.holder: k.name for k in public_name_keys(policy)}
    assert found == {
        "approvers[approver-jane]": "payment.verify-refund",
        "approvers[approver-kim]": "recovery-approver",
        "approvers[approver-lee]": "p",
    }


def test_names_from_outside_the_policy_can_be_added() -> None:
    policy = _policy({"approver-jane": public_key_b64(insecure_test_key("mallory"))})
    assert public_name_keys(policy) == ()
    (found,) = public_name_keys(policy, extra_names=["mallory"])
    assert (found.holder, found.name) == ("approvers[approver-jane]", "mallory")
