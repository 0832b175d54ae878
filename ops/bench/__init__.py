"""Benchmarks, kept out of the runtime packages (docs/PERFORMANCE.md has the figures).

`recoveryctl bench` measures the controller against the bare pipeline in the same run:
`workload` generates the traffic, `roles` runs the controller and the relay as child
processes, `baseline_pipeline` and `baseline_sink` are the bare pipeline, `runner` runs
the phases, `report` prints and writes the figures. The component benchmarks run alone
(`python -m ops.bench.core`, `.intake`, `.ledger`, `.relay`, `.relay_encode`).

The harness reaches psycopg and confluent_kafka directly: the baseline is, by
definition, the drivers without our code, and the ledger benchmark reads its server's
backend through its own connection.
"""

from __future__ import annotations

from ops.bench.runner import BenchConfig, BenchResult, run_bench

__all__ = ["BenchConfig", "BenchResult", "run_bench"]
