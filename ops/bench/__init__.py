"""`recoveryctl bench`: the controller measured against the bare pipeline in the same run
(docs/PERFORMANCE.md). `workload` generates the traffic, `roles` runs the controller and
the relay as child processes, `runner` runs the phases, `report` prints and writes the
figures."""

from __future__ import annotations

from ops.bench.runner import BenchConfig, BenchResult, run_bench

__all__ = ["BenchConfig", "BenchResult", "run_bench"]
