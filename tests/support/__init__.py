"""Helpers behind the shared test fixtures in `tests/conftest.py`.

`services` starts (or finds) the session's Kafka broker and PostgreSQL server, `kafka`
makes per-test topics, `db` prepares the template database and per-test clones.
"""
