"""How the benchmark shows its figures: a progress line while it runs, a table at the
end, and a JSON file with every figure and a description of the machine it ran on.

The verdicts compare the figures with the targets of issue #20 on a 2-core machine with
Kafka and PostgreSQL on the same host: throughput at least 0.3 of the bare pipeline in
the same run and at least 6,000 events per second; p99 at most 60 ms at 500 and at most
100 ms at 1,000 events per second offered; controller and relay peak resident memory at
most 150 MB each, and flat as the backlog grows (10,000 to 200,000 events in the full
run: `--memory-backlogs 10000,50000 --full-memory`).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

from ops.bench.baseline_pipeline import kafka_versions
from ops.bench.baseline_sink import server_version
from ops.bench.runner import LATENCY_STAGES, BenchResult

__all__ = [
    "Progress",
    "code_version",
    "machine_description",
    "render_table",
    "verdicts",
    "write_json",
]

TARGET_RATIO: Final = 0.3
TARGET_RATE: Final = 6_000.0
# Offered rate → the p99 it must stay under, ms.
TARGET_P99_MS: Final = {500: 60.0, 1000: 100.0}
TARGET_RSS_MB: Final = 150.0
# Peak RSS may grow this much from the smallest to the largest backlog and still count
# as flat (allocator noise, librdkafka buffers filling once).
FLAT_TOLERANCE: Final = 0.15
# The process kinds of the CPU table, in its order, with their column labels.
CPU_KINDS: Final = {
    "controller": "controllers",
    "relay": "relay",
    "broker": "broker",
    "postgres": "postgres",
    "bench": "bench",
    "other": "other",
}


class Progress:
    """One rewritten status line on a terminal; on a pipe, a line per message at most
    every `every` seconds (phase changes always print)."""

    def __init__(self, out: TextIO, every: float = 2.0) -> None:
        self._out = out
        self._tty = out.isatty()
        self._every = every
        self._start = time.monotonic()
        self._last = 0.0
        self._phase = ""

    def __call__(self, text: str, *, keep: bool = False) -> None:
        """Show `text` (its part before the first ':' names the phase); a `keep` line
        always prints and stays."""
        now = time.monotonic()
        phase = text.split(":", 1)[0]
        line = f"[{now - self._start:6.1f}s] {text}"
        if self._tty:
            end = "\n" if (phase != self._phase and self._phase) else ""
            self._out.write(f"{end}\r\x1b[2K{line}" + ("\n" if keep else ""))
            phase = "" if keep else phase
        elif keep or phase != self._phase or now - self._last >= self._every:
            self._out.write(line + "\n")
            self._last = now
        self._phase = phase
        self._out.flush()

    def done(self) -> None:
        """End the status line."""
        if self._tty:
            self._out.write("\n")
            self._out.flush()


def machine_description(
    database_url: str, commit: str | None = None, load_at_start: tuple[float, ...] = ()
) -> dict[str, Any]:
    """CPU model, cores, memory, OS, and the versions of Python, the Kafka client, the
    PostgreSQL server and this repository's commit (`commit`, read when the run began,
    else now); the load average now and `load_at_start`."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_mb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_mb = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "memory_mb": memory_mb,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "kafka_client": kafka_versions(),
        "postgresql": server_version(database_url),
        "commit": commit or code_version(),
        # The machine is shared: a load average above the core count means the figures
        # were taken while other work competed for the CPU.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def code_version() -> str:
    """This repository's commit, `+uncommitted` when tracked files differ from it."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def verdicts(result: BenchResult) -> dict[str, dict[str, Any]]:
    """Each target of the issue: the measured figure, the target and whether it holds."""
    sat = result.saturation
    out: dict[str, dict[str, Any]] = {
        "throughput_ratio": _verdict(sat.get("ratio_to_baseline", 0.0), TARGET_RATIO, above=True),
        "throughput_rate": _verdict(sat.get("events_per_second", 0.0), TARGET_RATE, above=True),
    }
    for rate, target in TARGET_P99_MS.items():
        at_rate = [x for x in result.latency if x["offered_rate"] == rate]
        if at_rate:
            out[f"p99_at_{rate}"] = _verdict(at_rate[0]["p99_ms"], target, above=False)
    for role in ("controller", "relay"):
        out.update(_memory_verdicts(result, role))
    return out


def _memory_verdicts(result: BenchResult, role: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    peaks = [m["roles"][role]["peak_rss_mb"] for m in result.memory]
    sat_peak = result.saturation.get("roles", {}).get(role, {}).get("peak_rss_mb")
    all_peaks = [p for p in [*peaks, sat_peak] if p is not None]
    if all_peaks:
        out[f"{role}_rss"] = _verdict(max(all_peaks), TARGET_RSS_MB, above=False)
    if len(peaks) >= 2:
        # Two readings of "flat": the peak across backlog sizes, and the RSS within the
        # largest drain once it is under way (after its first tenth), which is what
        # grows if anything is kept per event.
        over = f"{result.memory[0]['backlog']:,}-{result.memory[-1]['backlog']:,} events"
        growth = (peaks[-1] - peaks[0]) / peaks[0] if peaks[0] else 0.0
        out[f"{role}_peak_growth"] = {
            **_verdict(round(growth, 3), FLAT_TOLERANCE, above=False),
            "over": over,
        }
        samples = result.memory[-1]["roles"][role]["rss_samples_mb"][:-1]
        if len(samples) >= 10:
            early = samples[len(samples) // 10]
            drift = (max(samples[len(samples) // 10 :]) - early) / early if early else 0.0
            out[f"{role}_rss_flat_in_drain"] = {
                **_verdict(round(drift, 3), FLAT_TOLERANCE, above=False),
                "over": f"the {result.memory[-1]['backlog']:,}-event drain",
            }
    return out


def _verdict(value: float, target: float, *, above: bool) -> dict[str, Any]:
    met = value >= target if above else value <= target
    return {"value": value, "target": target, "met": met}


def render_table(result: BenchResult, out: TextIO) -> None:
    """The figures as a plain table, then the verdicts."""
    w = result.workload
    sat, base = result.saturation, result.baseline
    lines = [
        f"workload: {w.get('records', 0):,} records, {w.get('operations', 0):,} operations, "
        f"{w.get('commands', 0):,} commands, {w.get('dead_letters_expected', 0):,} dead letters "
        f"expected; partitions {result.config['partitions']}",
        "",
        f"{'throughput (backlog drain)':<34}{'records':>10}{'seconds':>10}{'ev/s':>10}",
        f"{'  bare pipeline (median of ' + str(len(base.get('drains', ()))) + ')':<34}"
        f"{base.get('records', 0):>10,}"
        f"{base.get('seconds', 0):>10.2f}{base.get('events_per_second', 0):>10,.0f}",
        f"{'  controller + relay':<34}{sat.get('records', 0):>10,}"
        f"{sat.get('seconds', 0):>10.2f}{sat.get('events_per_second', 0):>10,.0f}",
        f"{'  ratio to baseline':<34}{sat.get('ratio_to_baseline', 0):>30.2f}",
        "",
        f"{'latency (event → command readable)':<34}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}  ms",
    ]
    for x in result.latency:
        lines.append(
            f"{'  offered ' + str(x['offered_rate']) + ' ev/s':<34}{x['p50_ms']:>8.1f}"
            f"{x['p95_ms']:>8.1f}{x['p99_ms']:>8.1f}{x['max_ms']:>8.1f}"
        )
    lines += _stage_lines(result.latency)
    lines += ["", f"{'memory (peak RSS, MB)':<34}{'controller':>12}{'relay':>10}{'ev/s':>10}"]
    roles = sat.get("roles", {})
    if roles:
        lines.append(
            f"{'  saturation + latency phases':<34}{roles['controller']['peak_rss_mb']:>12.1f}"
            f"{roles['relay']['peak_rss_mb']:>10.1f}{'':>10}"
        )
    for m in result.memory:
        lines.append(
            f"{'  backlog ' + format(m['backlog'], ',') + ' events':<34}"
            f"{m['roles']['controller']['peak_rss_mb']:>12.1f}"
            f"{m['roles']['relay']['peak_rss_mb']:>10.1f}{m['events_per_second']:>10,.0f}"
        )
    lines += _scaling_lines(result.scaling)
    lines += _cpu_lines(result.scaling, result.latency)
    lines += _profile_lines(result.profile)
    lines += _timer_lines(result.timers)
    lines += ["", "targets (issue #20):"]
    for name, v in verdicts(result).items():
        over = f"  ({v['over']})" if "over" in v else ""
        lines.append(
            f"  {name:<30} {v['value']!s:>10}  target {v['target']!s:>8}  "
            f"{'met' if v['met'] else 'MISSED'}{over}"
        )
    if result.notes:
        lines += ["", "notes:", *(f"  {note}" for note in result.notes)]
    out.write("\n".join(lines) + "\n")


def _timer_lines(timers: dict[str, Any]) -> list[str]:
    """The timer storm: how long the due timers took, and the live throughput meanwhile."""
    if not timers:
        return []
    ratio = timers.get("live_ratio_to_saturation")
    return [
        "",
        f"timer storm: {timers['timers']:,} timers due at once, with a live backlog of "
        f"{timers['live_records']:,} records",
        f"  {'all fired and decided':<32}{timers['drain_seconds']:>10.1f} s"
        f"{timers['timers_per_second']:>12,.0f} timers/s",
        f"  {'live backlog meanwhile':<32}{timers['live_seconds']:>10.1f} s"
        f"{timers['live_events_per_second']:>12,.0f} ev/s"
        + ("" if ratio is None else f"  ({ratio:.2f} of saturation)"),
    ]


def _scaling_lines(scaling: list[dict[str, Any]]) -> list[str]:
    """Throughput by number of controller processes in the group."""
    if not scaling:
        return []
    lines = [
        "",
        f"{'scaling (controllers, one relay)':<34}{'records':>10}{'seconds':>10}{'ev/s':>10}"
        f"{'load s':>10}{'ev/s/ctl':>10}",
    ]
    for row in scaling:
        label = f"  {row['members']} controller{'s' if row['members'] > 1 else ''}"
        if row["phase"] == "saturation":
            label += " (saturation)"
        load = row.get("load_seconds")
        lines.append(
            f"{label:<34}{row['records']:>10,}{row['seconds']:>10.2f}"
            f"{row['events_per_second']:>10,.0f}{'-' if load is None else f'{load:.2f}':>10}"
            f"{row['events_per_second'] / row['members']:>10,.0f}"
        )
    lines.append(
        "  the members join first, then the backlog is produced (load s); a drain not much"
    )
    lines.append("  longer than its load was bounded by the producer")
    return lines


def _cpu_lines(scaling: list[dict[str, Any]], latency: list[dict[str, Any]]) -> list[str]:
    """CPU per record by process kind, per drain (scaling rows) and per offered rate
    (latency phases, per record offered), and what each projects."""
    rows = [(_scaling_label(r), r["cpu"]) for r in scaling if r.get("cpu")]
    rows += [(f"@ {x['offered_rate']} ev/s", x["cpu"]) for x in latency if x.get("cpu")]
    if not rows:
        return []
    lines = [
        "",
        "cpu per record, µs (cores busy): drains by members, then each offered rate",
        f"{'  phase':<16}" + "".join(f"{label:>15}" for label in CPU_KINDS.values()),
    ]
    for label, cpu in rows:
        cells = []
        for kind in CPU_KINDS:
            figure = cpu["kinds"].get(kind)
            cells.append(
                f"{'-':>15}"
                if figure is None
                else f"{figure['us_per_event']:>8,.0f} ({figure['cores_busy']:.2f})"
            )
        lines.append(f"{'  ' + label:<16}" + "".join(cells))
    for label, cpu in rows:
        backends = ", ".join(
            f"{kind} {figure['us_per_event']:,.0f}"
            for kind, figure in cpu["database_backends"].items()
        )
        lines.append(
            f"  {label}: pipeline {cpu['pipeline_us_per_event']:,.0f} µs/record "
            f"(controllers, relay, broker, postgres) = {cpu['events_per_core_second']:,.0f} "
            f"records/s per core if only CPU limited it; machine busy "
            f"{cpu['machine']['cores_busy']:.2f} cores; postgres backends of the bench "
            f"database: {backends or '-'} µs/record"
        )
    return lines


def _scaling_label(row: dict[str, Any]) -> str:
    return "1 (saturation)" if row["phase"] == "saturation" else str(row["members"])


def _profile_lines(profile: dict[str, Any]) -> list[str]:
    """The top of the py-spy profiles and of pg_stat_statements (`--profile`)."""
    if not profile:
        return []
    lines: list[str] = []
    for name, figures in profile.get("py_spy", {}).items():
        if "error" in figures:
            lines += ["", f"profile of the {name}: py-spy failed: {figures['error']}"]
            continue
        lines += [
            "",
            f"profile of the {name} (saturation, py-spy, {figures['samples']:,} samples of "
            f"running threads): {figures['file']}",
            "  samples by thread: "
            + ", ".join(f"{t} {n:,}" for t, n in figures.get("threads", {}).items()),
            f"  {'self %':>7}  function",
        ]
        lines += [f"  {f['percent']:>7.1f}  {f['function']}" for f in figures["self"][:8]]
        lines.append(f"  {'incl %':>7}  function")
        lines += [f"  {f['percent']:>7.1f}  {f['function']}" for f in figures["inclusive"][:8]]
        if "kinds" in figures:
            kinds = figures["kinds"]
            lines.append(
                f"  by kind of code (py-spy --native; {kinds['samples']:,} samples, "
                f"{kinds['waiting']:,} waiting left out):"
            )
            lines += [f"  {k['percent']:>7.1f}  {k['kind']}" for k in kinds["kinds"]]
    statements = profile.get("statements") or []
    if statements:
        lines += [
            "",
            "statements (pg_stat_statements, saturation window, by total time)",
            f"  {'total ms':>9}{'µs/rec':>8}{'calls/rec':>10}{'mean ms':>9}  query",
        ]
        lines += [
            f"  {s['total_ms']:>9,.0f}{s['us_per_event']:>8,.0f}{s['calls_per_event']:>10.3f}"
            f"{s['mean_ms']:>9.3f}  {s['query']}"
            for s in statements
        ]
    elif profile.get("statements_note"):
        lines += ["", f"statements: {profile['statements_note']}"]
    return lines


def write_json(
    result: BenchResult, machine: dict[str, Any], command: str, path: Path
) -> dict[str, Any]:
    """Write every figure, the verdicts, the machine and the command line to `path`."""
    document = {
        "command": command,
        "run_id": result.run_id,
        "machine": machine,
        "config": result.config,
        "workload": result.workload,
        "baseline": result.baseline,
        "saturation": result.saturation,
        "latency": result.latency,
        "memory": result.memory,
        "scaling": result.scaling,
        "profile": result.profile,
        "timers": result.timers,
        "verdicts": verdicts(result),
        "notes": result.notes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return document


def _stage_lines(latency: list[dict[str, Any]]) -> list[str]:
    """Where the time went, per offered rate: p50 and p99 of each stage, and its mean
    over the slowest 1% of events (which stage a bad p99 comes from)."""
    lines: list[str] = []
    for x in latency:
        stages = x.get("stages") or {}
        if not stages:
            continue
        lines += [
            "",
            f"{'  stages @ ' + str(x['offered_rate']) + ' ev/s':<34}{'p50':>8}{'p99':>8}"
            f"{'slowest 1%':>12}  ms",
        ]
        for name, label in LATENCY_STAGES.items():
            stage = stages[name]
            lines.append(
                f"{'    ' + label:<34}{stage['p50_ms']:>8.1f}{stage['p99_ms']:>8.1f}"
                f"{stage['slowest_1pct_mean_ms']:>12.1f}"
            )
        window = x.get("slowest_1pct_sent_s")
        if window:
            lines.append(
                f"    the slowest 1% were sent {window[0]:.2f}-{window[1]:.2f} s into the phase"
            )
        if "page_cache_sync_s" in x:
            lines.append(
                f"    before it, writing back the page cache took {x['page_cache_sync_s']:.2f} s"
            )
    return lines
