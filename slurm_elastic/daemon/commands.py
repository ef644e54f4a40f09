"""CLI commands of the service area: ``daemon``, ``status``, ``plan``, ``explain``, ``config``.

``slurm-elastic --help`` imports this module to show one line per command, so it imports
only click and the standard library at module level; everything else is imported inside
the command that needs it.

Output: rich tables on a TTY, plain aligned text otherwise (pipes, scripts); ``--json``
everywhere a machine might read.  Errors are one line (click's ``Error: ...``), exit 1.
Job names, users, reasons and Slurm's messages are written by users: every line for a
human goes out through ``_say``, ``_Error`` or ``render_table``, which show control and
format characters escaped (``terminal.safe_text``), never raw.
A failed or stale cycle still prints its output, then exits with its own status
(``exitcodes.ExitCode``, docs/cli-exit-codes.md) so that scripts need not parse text.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from slurm_elastic.daemon.exitcodes import ExitCode
from slurm_elastic.protocol import Fallback
from slurm_elastic.terminal import safe_text

if TYPE_CHECKING:
    from slurm_elastic.config import Config

_CONFIG_OPTION = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Main config file (default: $SLURM_ELASTIC_CONFIG, else /etc/slurm-elastic/"
    "slurm-elastic.yaml).",
)

# squeue's compact state codes, so that the table reads like squeue.
_STATE_CODES = {
    "PENDING": "PD",
    "RUNNING": "R",
    "SUSPENDED": "S",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "CONFIGURING": "CF",
    "CANCELLED": "CA",
    "FAILED": "F",
    "TIMEOUT": "TO",
    "PREEMPTED": "PR",
    "NODE_FAIL": "NF",
    "REQUEUED": "RQ",
    "RESIZING": "RS",
    "OUT_OF_MEMORY": "OOM",
    "BOOT_FAIL": "BF",
    "DEADLINE": "DL",
}

STATUS_COLUMNS: tuple[str, ...] = (
    "JOBID",
    "PARTITION",
    "NAME",
    "USER",
    "ST",
    "NODES",
    "MIN",
    "MAX",
    "TARGET",
)
# LOAN: nodes a running elastic job holds above its entitlement (policy.reclaim), given
# back when a job ahead of it in Slurm's queue needs them.
STATUS_COLUMNS += ("LOAN",)
# STEP/RATE: the job's latest progress report (training step, samples/s): is it reporting?
# SAVED: how much sooner its resizes got it where it is than its first size would have
# (daemon.reports.Tally; negative while it is behind, for example after giving nodes away).
STATUS_COLUMNS += ("STEP", "RATE", "SAVED", "REASON")


class _Error(click.ClickException):
    """click's ``Error: ...`` line, with user-written text in it shown escaped."""

    def format_message(self) -> str:
        return safe_text(self.message)


class CycleFailed(_Error):
    """``Error: ...`` like any other, but exit 3: the command ran and the cycle failed."""

    exit_code = ExitCode.CYCLE_FAILED


class StateFault(_Error):
    """``Error: <file>: ...``, exit 5: the state directory or the journal cannot be used."""

    exit_code = ExitCode.STATE


def _load_config(config_file: Path | None, *, verbose: bool = False) -> Config:
    """The config for a one-shot command; its logs go to stderr, warnings only by default."""
    from slurm_elastic.config import load_main
    from slurm_elastic.errors import ConfigError
    from slurm_elastic.logs import configure_logging

    try:
        config = load_main(config_file)
    except ConfigError as exc:
        raise _Error(str(exc)) from None
    configure_logging("debug" if verbose else "warning", config.log.json_)
    return config


# --------------------------------------------------------------------------- output


def _say(line: str, *, err: bool = False) -> None:
    """One line for a human (never JSON): what users wrote in it is shown escaped."""
    click.echo(safe_text(line), err=err)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return safe_text(value)


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None
) -> None:
    """rich on a TTY; plain, space-aligned columns (last one unpadded) otherwise."""
    cells = [[_cell(v) for v in row] for row in rows]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=title, box=None, header_style="bold", pad_edge=False)
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in cells:
            # Text, not str: rich reads "[link=...]" in a str as markup (an OSC 8 link).
            table.add_row(*(Text(cell) for cell in row))
        Console().print(table)
        return
    if title:
        _say(title)
    for line in aligned(headers, cells):
        _say(line)


def aligned(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Plain, space-aligned columns (last one unpadded), the header first."""
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    return [
        " ".join(
            [*(c.ljust(w) for c, w in zip(line[:-1], widths[:-1], strict=True)), line[-1]]
        ).rstrip()
        for line in [list(headers), *cells]
    ]


def _echo_json(value: Any) -> None:
    from slurm_elastic.daemon.status import json_safe

    click.echo(json.dumps(json_safe(value), indent=2, sort_keys=True, default=str))


# --------------------------------------------------------------------------- daemon


@click.command()
@_CONFIG_OPTION
@click.option("--once", is_flag=True, help="Run one cycle, publish it, and exit.")
def daemon(config_file: Path | None, once: bool) -> None:
    """Run the head-node daemon (systemd: Type=notify; SIGHUP reloads the config).

    \b
    Exit status: 0 stopped by SIGTERM/SIGINT, or --once and its cycle succeeded;
    1 could not start (config, API port); 2 usage;
    3 --once and its one cycle failed (Slurm unreachable, output not understood);
    5 the state directory or journal cannot be used (read-only, full, corrupt),
    at start-up or while running.
    Without --once a failed cycle never ends the daemon (see /healthz).
    """
    from slurm_elastic.daemon.service import run_daemon
    from slurm_elastic.errors import SlurmElasticError, StateError

    try:
        code = run_daemon(config_file, once=once)
    except StateError as exc:
        raise StateFault(str(exc)) from None
    except (SlurmElasticError, OSError) as exc:
        raise _Error(str(exc)) from None
    sys.exit(code)


# --------------------------------------------------------------------------- status


def fetch_status(config: Config, api: str | None, status_file: Path | None) -> tuple[dict, str]:
    """The daemon's status document: from its API as the calling user (a MUNGE credential:
    the daemon shows what Slurm's PrivateData lets this user see), else from
    ``<state_dir>/status.json`` (readable by root alone when anything is private)."""
    from slurm_elastic.daemon.status import STATUS_FILE, read_document
    from slurm_elastic.errors import AgentError
    from slurm_elastic.protocol import get_status

    problems: list[str] = []
    if status_file is None:
        host = config.api.bind if config.api.bind not in ("0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        url = (api or f"http://{host}:{config.api.port}").rstrip("/") + "/v1/status"
        try:
            answer = get_status(url, timeout_s=5)
            if answer.status == 200:
                return answer.body, url
            problems.append(f"{url}: HTTP {answer.status} {answer.body.get('error', '')}".strip())
        except AgentError as exc:
            problems.append(str(exc))
        if api is not None:
            raise _Error("; ".join(problems))
        status_file = Path(config.state_dir) / STATUS_FILE
    try:
        return read_document(status_file), str(status_file)
    except (OSError, ValueError) as exc:
        problems.append(f"{status_file}: {getattr(exc, 'strerror', None) or exc}")
        raise _Error("no daemon status: " + "; ".join(problems)) from None


class StatusProblem(NamedTuple):
    """Why a status document cannot be trusted as current, and the exit status that says so."""

    exit_code: ExitCode
    warning: str


def status_problem(document: dict[str, Any], config: Config, now: float) -> StatusProblem | None:
    """Stale (the daemon stopped cycling) before failed: a stale document's failure is old news.

    ``status`` and ``explain`` print the warning and still show the rows (from the last good
    cycle), then exit with the problem's code so that a script sees it without parsing.
    """
    from slurm_elastic.daemon.status import age_s

    # The daemon's own interval (from the document) sets the pace; the same window as /healthz.
    interval = float(document.get("daemon", {}).get("interval_s") or config.interval_s)
    window = 3 * interval + config.slurm.timeout_s
    age = age_s(document, now)
    if age > window:
        return StatusProblem(
            ExitCode.STALE,
            f"status is {age:.0f}s old (daemon interval {interval:g}s): "
            "is the daemon running? (systemctl status slurm-elastic)",
        )
    cycle = document.get("cycle", {})
    if cycle.get("ok") is False:
        return StatusProblem(
            ExitCode.CYCLE_FAILED,
            f"the last cycle failed: {cycle.get('error')}; rows are from the last good cycle",
        )
    return None


def filter_jobs(
    jobs: Sequence[dict[str, Any]], users: Sequence[str], job_ids: Sequence[int]
) -> list[dict[str, Any]]:
    return [
        j
        for j in jobs
        if (not users or j.get("user") in users) and (not job_ids or j.get("job_id") in job_ids)
    ]


def _status_row(job: dict[str, Any]) -> list[Any]:
    state = str(job.get("state", ""))
    return [
        job.get("job_id"),
        job.get("partition"),
        job.get("name"),
        job.get("user"),
        _STATE_CODES.get(state, state[:2]),
        job.get("nodes"),
        job.get("min"),
        job.get("max"),
        job.get("target"),
        job.get("loan"),
        job.get("step"),
        job.get("samples_per_s"),
        _duration(job.get("saved_s")),
        _with_fallback(job.get("reason") or "", job.get("fallback")),
    ]


# What a report's ``fallback`` (protocol.Fallback) means, in the daemon's words: the job's
# report picks one of these, never the text.
FALLBACK_TEXT: dict[str, str] = {
    Fallback.OUTSIDE_KILLS.value: "restart mode: torchft kill requests from outside the job "
    "ended its replica groups",
}


def _with_fallback(reason: str, fallback: Any) -> str:
    text = FALLBACK_TEXT.get(fallback) if isinstance(fallback, str) else None
    if text is None:
        return reason
    return f"{reason}; {text}" if reason else text


def _duration(seconds: Any) -> str | None:
    """A signed, readable duration (+1h05m, -42s); None (shown empty) when unknown."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return None
    sign = "-" if seconds < 0 else "+"
    left = round(abs(seconds))
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def _parse_job_ids(values: Sequence[str]) -> list[int]:
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit():
                raise click.BadParameter(f"not a job id: {part!r}", param_hint="-j/--jobs")
            ids.append(int(part))
    return ids


@click.command()
@_CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="The status document as JSON.")
@click.option("-u", "--user", "users", multiple=True, help="Only jobs of this user.")
@click.option("-j", "--jobs", "job_ids", multiple=True, help="Only these job ids (comma list).")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("--api", default=None, help="Daemon API base URL (default from the config).")
@click.option(
    "--file",
    "status_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read this status.json instead of asking the daemon.",
)
def status(
    config_file: Path | None,
    as_json: bool,
    users: tuple[str, ...],
    job_ids: tuple[str, ...],
    me: bool,
    api: str | None,
    status_file: Path | None,
) -> None:
    """Jobs as the daemon sees them (squeue-like), with its target size and reason.

    \b
    Exit status: 0 ok; 1 no status could be read; 2 usage;
    3 the daemon's last cycle failed; 4 the status is stale (daemon not cycling).
    With 3 and 4 the table (or JSON) is still printed, after a warning on stderr.
    """
    config = _load_config(config_file)
    document, source = fetch_status(config, api, status_file)
    wanted_users = list(users) + ([pwd.getpwuid(os.getuid()).pw_name] if me else [])
    jobs = filter_jobs(document.get("jobs", []), wanted_users, _parse_job_ids(job_ids))
    problem = status_problem(document, config, time.time())
    if problem:
        _say(f"warning: {problem.warning}", err=True)
    if as_json:
        _echo_json({**document, "jobs": jobs, "source": source})
    else:
        _status_table(document, jobs, source)
    if problem:
        sys.exit(problem.exit_code)


def _status_table(document: dict[str, Any], jobs: Sequence[dict[str, Any]], source: str) -> None:
    cycle = document.get("cycle", {})
    daemon_info = document.get("daemon", {})
    render_table(STATUS_COLUMNS, [_status_row(j) for j in jobs])
    _say(
        f"# mode {daemon_info.get('mode')}, policy {daemon_info.get('policy')}, "
        f"cycle {cycle.get('count')} {'ok' if cycle.get('ok') else 'FAILED'}, "
        f"{time.time() - float(document.get('generated_at', 0)):.0f}s ago ({source})",
        err=not sys.stdout.isatty(),
    )
    loaned = document.get("nodes_on_loan")
    reclaims = document.get("reclaims") or []
    if loaned or reclaims:
        line = f"# {loaned or 0} nodes on loan"
        if reclaims:
            last = reclaims[-1]
            line += (
                f"; last reclaim: job {last.get('borrower')} gave back {last.get('nodes')} "
                f"to job {last.get('waiting_job')} in {last.get('seconds')}s"
            )
        _say(line, err=not sys.stdout.isatty())
    typed = {p: t for p, t in (document.get("gpu_types") or {}).items() if t}
    if typed:
        kinds = ", ".join(f"{p} {t}" for p, t in sorted(typed.items()))
        _say(f"# GPU types: {kinds}", err=not sys.stdout.isatty())


# --------------------------------------------------------------------------- plan / explain


@contextmanager
def _journal_copy(state_dir: Path) -> Iterator[Any]:
    """A private copy of the daemon's journal: a dry run sees its cooldowns, changes nothing."""
    import sqlite3

    from slurm_elastic.actuate.journal import Journal
    from slurm_elastic.errors import StateError

    source = state_dir / "journal.sqlite"
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-plan.") as tmp:
        target = Path(tmp) / "journal.sqlite"
        if source.is_file():
            try:
                with (
                    sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src,
                    sqlite3.connect(target) as dst,
                ):
                    src.backup(dst)
            except sqlite3.Error as exc:
                _say(f"warning: cannot copy {source} ({exc}); using an empty journal", err=True)
                target.unlink(missing_ok=True)
        try:
            journal = Journal(target)
        except StateError as exc:  # the copy is as damaged as its source
            detail = str(exc).removeprefix(f"{target}: ")
            _say(f"warning: cannot use {source} ({detail}); using an empty journal", err=True)
            target.unlink(missing_ok=True)
            journal = Journal(target)
        try:
            yield journal
        finally:
            journal.close()


def dry_run_cycle(config: Config) -> Any:
    """One cycle against the live cluster, shadow mode, Slurm actions disabled."""
    from slurm_elastic.actuate.instructions import InstructionBoard
    from slurm_elastic.daemon.controller import Controller
    from slurm_elastic.daemon.reports import ReportStore
    from slurm_elastic.daemon.service import make_backend

    shadow = config.model_copy(update={"mode": "shadow"})
    backend = make_backend(shadow, dry_run=True)
    with _journal_copy(Path(config.state_dir)) as journal:
        controller = Controller(
            backend, shadow, reports=ReportStore(), journal=journal, agents=InstructionBoard()
        )
        return controller.run_once(time.time())


def _decision_rows(plan: dict[str, Any] | None, job_ids: Sequence[int]) -> list[list[Any]]:
    rows = []
    for d in (plan or {}).get("decisions", []):
        if job_ids and d["job_id"] not in job_ids:
            continue
        change = d["target_nodes"] - d["current_nodes"]
        rows.append(
            [
                d["job_id"],
                d["current_nodes"],
                d["target_nodes"],
                f"{change:+d}" if change else "=",
                d["rule"],
                d["predicted_gain"],
                d["resize_cost"],
                d.get("detail", ""),
            ]
        )
    return rows


def _plan_header(plan: dict[str, Any] | None) -> str:
    if plan is None:
        return "no plan"
    note = f" ({plan['note']})" if plan.get("note") else ""
    return (
        f"plan: solver {plan['solver']}, {plan['status']}, objective {plan['objective']:.4g}, "
        f"solved in {plan['solve_s']:.3f}s{note}"
    )


_DECISION_COLUMNS = ("JOBID", "NOW", "TARGET", "CHANGE", "RULE", "GAIN", "COST", "DETAIL")
_ACTION_COLUMNS = ("JOBID", "ACTION", "FROM", "TO", "OUTCOME", "DETAIL")


def _action_rows(actions: Sequence[dict[str, Any]], job_ids: Sequence[int]) -> list[list[Any]]:
    return [
        [a["job_id"], a["kind"], a["from_nodes"], a["to_nodes"], a["outcome"], a["detail"]]
        for a in actions
        if not job_ids or a["job_id"] in job_ids
    ]


@click.command()
@_CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="The cycle result as JSON.")
def plan(config_file: Path | None, as_json: bool) -> None:
    """What the daemon would do now: one dry-run cycle against the live cluster.

    Shadow mode with Slurm actions disabled; cooldowns come from a copy of the daemon's
    journal.  Progress reports live in the running daemon, so this plan uses priors.

    \b
    Exit status: 0 ok; 1 error (config); 2 usage;
    3 the dry-run cycle failed (Slurm unreachable, output not understood):
    --json still prints the result ("ok": false, "error") on stdout.
    """
    config = _load_config(config_file)
    result = dry_run_cycle(config)
    wire = result.to_json()
    if as_json:
        _echo_json(wire)  # even when the cycle failed: a script reads "error" from it
    if not result.ok:
        raise CycleFailed(f"dry-run cycle failed: {result.error}")
    if as_json:
        return
    _say(_plan_header(wire["plan"]))
    render_table(_DECISION_COLUMNS, _decision_rows(wire["plan"], ()))
    actions = _action_rows(wire["actions"], ())
    click.echo("")
    if actions:
        render_table(_ACTION_COLUMNS, actions, title="actions (shadow: none applied)")
    else:
        _say("actions: none (every elastic job is at its target)")


@click.command()
@_CONFIG_OPTION
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="The explanation as JSON.")
@click.option(
    "--dry-run", is_flag=True, help="Compute a fresh dry-run cycle instead of asking the daemon."
)
@click.option("--api", default=None, help="Daemon API base URL (default from the config).")
def explain(
    config_file: Path | None, job_id: int, as_json: bool, dry_run: bool, api: str | None
) -> None:
    """Why JOB_ID has (or will get) its size: predicted gain, cost, the deciding rule.

    \b
    Exit status: 0 ok; 1 error (no status, job not in the daemon's view); 2 usage;
    3 the cycle failed (--dry-run: no explanation; else the daemon's last cycle,
    explained from the last good one); 4 the daemon's status is stale (still explained).
    """
    config = _load_config(config_file)
    problem: StatusProblem | None = None
    if dry_run:
        result = dry_run_cycle(config)
        if not result.ok:
            raise CycleFailed(f"dry-run cycle failed: {result.error}")
        wire = result.to_json()
        source = "dry-run cycle"
    else:
        wire, source = fetch_status(config, api, None)
        problem = status_problem(wire, config, time.time())
        if problem:
            _say(f"warning: {problem.warning}", err=True)
    found = explain_job(wire, job_id)
    if found is None:
        raise _Error(f"job {job_id} is not in the daemon's view ({source})")
    if as_json:
        _echo_json({**found, "source": source})
    else:
        for line in explain_lines(found):
            _say(line)
    if problem:
        sys.exit(problem.exit_code)


def explain_job(wire: dict[str, Any], job_id: int) -> dict[str, Any] | None:
    """Pure: gather the row, decision and actions of one job from a status/cycle document."""
    row = next((j for j in wire.get("jobs", []) if j.get("job_id") == job_id), None)
    plan = wire.get("plan") or {}
    decision = next((d for d in plan.get("decisions", []) if d["job_id"] == job_id), None)
    actions = [a for a in wire.get("actions", []) if a.get("job_id") == job_id]
    if row is None and decision is None:
        return None
    return {
        "job": row,
        "decision": decision,
        "actions": actions,
        "plan": _plan_header(plan or None),
    }


def explain_lines(found: dict[str, Any]) -> list[str]:
    row, decision = found["job"], found["decision"]
    lines = []
    if row is not None:
        size = f"{row['nodes']} node(s)"
        bounds = f", elastic {row['min']}-{row['max']}" if row.get("min") is not None else ""
        lines.append(
            f"job {row['job_id']} ({row['name']}, user {row['user']}, {row['partition']}): "
            f"{row['state']} at {size}{bounds}"
        )
        lines.append(f"  reason: {row.get('reason') or '-'}")
        if row.get("fallback") in FALLBACK_TEXT:
            lines.append(f"  mode: {FALLBACK_TEXT[row['fallback']]}")
    if decision is None:
        lines.append("  no decision: the daemon does not resize this job")
    else:
        lines += [
            f"  target: {decision['current_nodes']} -> {decision['target_nodes']} node(s)",
            f"  rule: {decision['rule']}"
            + (f" ({decision['detail']})" if decision.get("detail") else ""),
            f"  predicted gain: {decision['predicted_gain']:.4g} steps over the horizon",
            f"  resize cost: {decision['resize_cost']:.4g} steps",
        ]
        lines += _candidate_lines(decision, (row or {}).get("measured") or [])
    for a in found["actions"]:
        lines.append(
            f"  action: {a['kind']} {a['from_nodes']}->{a['to_nodes']}: {a['outcome']}"
            + (f" ({a['detail']})" if a.get("detail") else "")
        )
    lines.append(f"  {found['plan']}")
    return lines


def _figure(value: Any, spec: str) -> str:
    """A number as ``spec``; ``-`` for what is not one (null: unknown or unbounded)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return "-"


def _candidate_lines(decision: dict[str, Any], measured: list[dict[str, Any]]) -> list[str]:
    """The sizes the policy weighed: measured and predicted rate, gain and cost of each."""
    candidates = decision.get("candidates") or []
    if not candidates:
        return []
    seen = {m.get("nodes"): m.get("steps_per_s") for m in measured}
    rows = []
    for c in candidates:
        nodes = c.get("nodes")
        mark = []
        if nodes == decision["current_nodes"]:
            mark.append("now")
        if nodes == decision["target_nodes"]:
            mark.append("chosen")
        rows.append(
            [
                str(nodes),
                _figure(seen.get(nodes), ".3g"),
                _figure(c.get("steps_per_s"), ".3g"),
                _figure(c.get("predicted_gain"), "+.4g"),
                _figure(c.get("resize_cost"), ".4g"),
                ", ".join(mark),
            ]
        )
    header = ("NODES", "MEASURED/S", "PREDICTED/S", "GAIN", "COST", "")
    return ["  sizes weighed (steps/s; gain and cost in steps over the horizon):"] + [
        "    " + line for line in aligned(header, rows)
    ]


# --------------------------------------------------------------------------- config


@click.group()
def config() -> None:
    """Inspect the daemon's configuration."""


@config.command("check")
@_CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Values and sources as JSON.")
def config_check(config_file: Path | None, as_json: bool) -> None:
    """Validate the config; print the effective value of every key and where it came from."""
    from slurm_elastic.config import flat_items

    cfg = _load_config(config_file)
    values = cfg.plain()
    flat = flat_items(values)
    provenance = cfg.provenance
    if as_json:
        _echo_json({"files": list(cfg.files), "values": values, "sources": provenance})
        return
    _say("# files read: " + (", ".join(cfg.files) or "none (all defaults)"))
    width = max(len(key) for key, _ in flat)
    for key, value in flat:
        shown = json.dumps(value, default=str)
        _say(f"{key.ljust(width)} = {shown.ljust(24)} # {provenance[key]}")
    if shutil.which("sinfo") is None:
        click.echo("# note: Slurm client commands are not on PATH", err=True)
