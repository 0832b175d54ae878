"""A review packet's guidance in sentences, for a person who has never seen the machine:
what `recoveryctl review` prints under "WHAT YOU ARE ASKED TO DECIDE" and the console's
review page shows above the details (one text, two faces).

Pure over the packet's JSON content (`machines.ReviewPacket.content`, its `guidance`
section and identities): `guidance_heading` names the operation, `guidance_sentences`
says, each as (label, sentence): what the current state means in the machine's words
(`now`), why it came to a person (`why`: the escalation's queue, severity and reason),
what the tool declared about the call (`the call`: idempotency key, side effect possible
or confirmed, status API, compensation), which commands no event has answered (`open`),
and where approving and rejecting lead (`approve`, `reject`: the state, its meaning, the
commands sent, or that none is and what the state then waits for).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["guidance_heading", "guidance_sentences"]


def guidance_heading(content: Mapping[str, Any]) -> str:
    """`operation op-17 of agent mail-agent (task t-1, for alice), recovered by machine
    email-send 1.0.0`."""
    op, ids = content["operation"], content["identities"]
    machine = op["machine"]
    return (
        f"operation {op['operation_id']} of agent {ids['agent']} (task {ids['task']}, for "
        f"{ids['initiating_principal']}), recovered by machine {machine['name']} "
        f"{machine['version']}"
    )


def guidance_sentences(content: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, sentence) for `now`, `why` (when escalated), `the call`, `open`,
    `approve` and `reject`."""
    g = content["guidance"]
    said = [("now", f"{g['state']['name']}: {g['state']['description'] or '-'}")]
    escalation = g["escalation"]
    if escalation is not None:
        said.append(
            (
                "why",
                f"escalated to queue {escalation['queue'] or '-'} (severity "
                f"{escalation['severity'] or '-'}): {escalation['reason'] or '-'}, when "
                f"{escalation['event_type']} was decided (#{escalation['decision_sequence']})",
            )
        )
    said.append(("the call", _facts(g["facts"])))
    said.append(("open", _open(g["unanswered_commands"])))
    said += [(verb, _after(g["after"][verb])) for verb in ("approve", "reject")]
    return said


def _facts(facts: Mapping[str, Any]) -> str:
    key = facts["idempotency_key"]
    if facts["side_effect_confirmed"]:
        effect = "the side effect is confirmed"
    elif facts["side_effect_possible"]:
        effect = "a side effect was possible, not confirmed (nobody knows yet whether it happened)"
    else:
        effect = "no side effect was possible (the call never left)"
    parts = [
        f"idempotency key {key}"
        if key
        else "no idempotency key declared (a retry could repeat the effect)",
        effect,
        "a status API can tell whether it happened"
        if facts["status_api"]
        else "no status API to ask",
        "it can be undone (compensation)"
        if facts["compensation_supported"]
        else "it cannot be undone",
        f"declared by {facts['declared_by'] or 'nobody'}",
    ]
    return "; ".join(parts)


def _open(unanswered: list[Mapping[str, Any]]) -> str:
    if not unanswered:
        return "every command issued has been answered"
    listed = ", ".join(f"{c['capability']} ({c['kind']}, {c['command_id']})" for c in unanswered)
    return f"{len(unanswered)} command(s) not answered yet: {listed}"


def _after(after: Mapping[str, Any] | None) -> str:
    if after is None:
        return "not accepted in this state"
    state = after["state"]
    sends = "sends " + ", ".join(after["commands"]) if after["commands"] else "sends no command"
    then = (
        "the operation ends there"
        if state["final"]
        else "then it waits for " + (", ".join(state["waits_for"]) or "nothing")
    )
    refused = f" (refused: {', '.join(after['refused'])})" if after["refused"] else ""
    return f"-> {state['name']}{refused}: {state['description'] or '-'} It {sends}; {then}."
