"""The ``--elastic[=SPEC]`` option (etc/spank/elastic.c + etc/job_submit.lua).

The plugin only makes the option exist; Slurm hands its argument to job_submit.lua in
``spank_job_env`` (``_SLURM_SPANK_OPTION_elastic_elastic=SPEC``, ``(null)`` without one),
which writes it as the marker it stands for.  So SPEC is sugar over the one marker grammar:
the stand-alone tests check that a job given ``--elastic=SPEC`` comes out exactly as one
whose comment holds the equivalent marker (``slurm_elastic.marker``'s rules and messages),
and the live tests (every Slurm version of the matrix) run the real sbatch, salloc and
slurmctld with the plugin that ``scripts/cluster.sh`` builds for the version.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.marker import _show as shown
from tests.slurm_cluster import ClusterUser, SlurmCluster, wait_until
from tests.test_marker_lua import NO_VAL, PRELUDE, python_result, run_driver

OPTION_ENV = "_SLURM_SPANK_OPTION_elastic_elastic="

# Reads "<min>\t<max>\t<hex comment>\t<hex SPEC, or - without the option>" per line; prints
# OK\t<hex comment>\t<min>\t<max> or ERR\t<hex message>.  spank_job_env is built the way
# slurmctld builds it: indexed from 0, other plugins' variables around the option's.
DRIVER = (
    PRELUDE
    + r"""
for line in io.lines() do
  local lo, hi, h, spec = string.match(line, "^(%d+)\t(%d+)\t(%x*)\t([%x-]*)$")
  local job = { min_nodes = tonumber(lo), max_nodes = tonumber(hi), comment = unhex(h) }
  if job.comment == "" then job.comment = nil end
  if spec ~= "-" then
    job.spank_job_env = { [0] = "OTHER_PLUGIN=1", [1] = "OPTION" .. unhex(spec), [2] = "X=y" }
  end
  user_msg = nil
  if slurm_job_submit(job, {}, 0) == slurm.SUCCESS then
    print(string.format("OK\t%s\t%d\t%d", hex(job.comment or ""), job.min_nodes, job.max_nodes))
  else
    print("ERR\t" .. hex(user_msg or "(no message)"))
  end
end
""".replace('"OPTION"', f'"{OPTION_ENV}"')
)

# (SPEC or None without the option, comment, --nodes min, --nodes max)
OptionCase = tuple[str | None, str, int | None, int | None]


def run_option(cases: list[OptionCase], tmp: Path) -> list[tuple[str, ...]]:
    lines = [
        f"{NO_VAL if lo is None else lo}\t{NO_VAL if hi is None else hi}\t"
        f"{comment.encode().hex()}\t{'-' if spec is None else spec.encode().hex()}"
        for spec, comment, lo, hi in cases
    ]
    return run_driver(DRIVER, lines, tmp)


def equivalent_marker(spec: str) -> str | None:
    """The marker ``--elastic=SPEC`` stands for (the grammar in job_submit.lua's header), or
    None when SPEC's head is neither options nor a MIN-MAX range."""
    if spec in ("", "(null)"):
        return "elastic"
    head, colon, rest = spec.partition(":")
    if "=" in head:
        return f"elastic:{spec}"
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", head)
    if not match:
        return None
    return f"elastic:min={match[1]},max={match[2]}" + (f",{rest}" if colon else "")


def expected(case: OptionCase) -> tuple[str, ...]:
    """What the plugin must do with ``case``: the equivalent comment's result, in the
    option's words when it is refused."""
    spec, comment, lo, hi = case
    assert spec is not None
    named = "--elastic" if spec == "(null)" else f"--elastic={shown(spec, 60)}"
    marker = equivalent_marker(spec)
    if marker is None:
        head = spec.partition(":")[0]
        return ("ERR", f"invalid {named}: '{shown(head)}' is not a node range MIN-MAX")
    result = python_result(f"{comment} {marker}" if comment else marker, lo, hi)
    if result[0] == "OK":
        return result
    reason = re.sub(r"^invalid elastic marker '.*?': ", "", result[1])
    reason = re.sub(r"min= in the marker$", "--elastic=MIN-MAX", reason)
    return ("ERR", f"invalid {named}: {reason}")


EXAMPLES: list[tuple[OptionCase, tuple[str, ...]]] = [
    (("(null)", "", 1, 3), ("OK", "elastic:min=1,max=3", "1", "3")),
    (("1-3", "", None, None), ("OK", "elastic:min=1,max=3", "1", "3")),
    (("2-4:step=2", "", None, None), ("OK", "elastic:min=2,max=4,step=2", "2", "4")),
    (("step=2", "nightly", 2, 4), ("OK", "nightly elastic:min=2,max=4,step=2", "2", "4")),
    (("2-8:gpus=4,cost=30", "", None, None),
     ("OK", "elastic:min=2,max=8,gpus=4,cost=30", "2", "8")),
    (("9-1", "", None, None), ("ERR", "invalid --elastic=9-1: min=9 is greater than max=1")),
    (("max=9", "", 1, 3), ("ERR", "invalid --elastic=max=9: max=9 disagrees with --nodes=1-3")),
    (("min=x", "", None, None),
     ("ERR", "invalid --elastic=min=x: min must be a whole number, got 'x'")),
    (("x-y", "", None, None), ("ERR", "invalid --elastic=x-y: 'x-y' is not a node range MIN-MAX")),
    (("(null)", "", None, None),
     ("ERR", "invalid --elastic: no node range: give --nodes=MIN-MAX or --elastic=MIN-MAX")),
    (("(null)", "run 4 elastic", 1, 3),
     ("ERR", "invalid --elastic: the comment has an elastic marker too ('elastic'): "
             "give one of them")),
    ((None, "", 1, 3), ("OK", "", "1", "3")),  # no option: untouched
]  # fmt: skip


def test_the_option_becomes_the_marker_it_stands_for(tmp_path: Path) -> None:
    cases = [case for case, _ in EXAMPLES]
    for (case, want), got in zip(EXAMPLES, run_option(cases, tmp_path), strict=True):
        assert got == want, case
        if case[0] is not None and case[0] != "x-y" and "too" not in want[1]:
            assert got == expected(case), case


spec_alphabet = st.sampled_from(list("0123456789-:=,minaxstepgpuscot"))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(spec_alphabet, max_size=24) | st.just("(null)"),
            st.sampled_from(["", "nightly", "run=4; x"]),
            st.none() | st.integers(1, 12),
            st.none() | st.integers(1, 12),
        ),
        min_size=1,
    )
)
def test_any_spec_is_judged_like_its_marker(tmp_path_factory, cases: list[OptionCase]) -> None:
    cases = [(s, c, lo, None if lo is None else hi) for s, c, lo, hi in cases]
    tmp = tmp_path_factory.mktemp("option")
    for case, got in zip(cases, run_option(cases, tmp), strict=True):
        assert got == expected(case), case


# SPECs a hostile user may pass (the option's argument is theirs, byte for byte): each is
# refused with one bounded line, or -- a huge max -- capped like the marker's.
HOSTILE_SPECS = [
    "1-3\nelastic:min=1,max=4",  # a forged second line
    "1-3\x1b[2J",  # a terminal escape
    "min=1,max=3\x00x",  # NUL
    "9" * 5000 + "-1",  # huge number, long text
    "1-" + "9" * 40,  # huge max
    "min=1,max=3," * 400,  # a long option list
    "1-3:" + "gpus=1," * 1000,  # duplicate keys, thousands of them
    "\u202e1-3",  # a bidi override (UTF-8 bytes)
    "1-2%",  # format directives (slurmctld's log_user is string.format): issue 38, class 4
    "%s",
    "1-2:gpus=%n",
    "%q-%d",
]


@pytest.mark.parametrize("spec", HOSTILE_SPECS)
def test_a_hostile_spec_gets_one_bounded_line(tmp_path: Path, spec: str) -> None:
    (got,) = run_option([(spec, "", None, None)], tmp_path)
    assert got[0] == "ERR", got
    message = got[1]
    assert "\n" not in message and "\x1b" not in message and "\x00" not in message, message
    assert len(message) < 300, len(message)
    assert message.startswith("invalid --elastic="), message


# ------------------------------------------------------------------ the real clusters

_MAIN = "import sys; from slurm_elastic.cli import main; sys.argv[0] = 'slurm-elastic'; main()"


def plan_rows(tmp_path: Path) -> dict[int, dict]:
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN, "plan", "--json", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    wire = json.loads(proc.stdout)
    assert wire["ok"] is True
    return {row["job_id"]: row for row in wire["jobs"]}


def submit(cluster: SlurmCluster, *args: str, cwd: Path) -> tuple[int | None, str]:
    proc = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", "shared", "-o", "/dev/null", *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=cwd,
    )
    job_id = int(proc.stdout.strip().split(";")[0]) if proc.returncode == 0 else None
    return job_id, proc.stderr


@pytest.mark.slurm
def test_sbatch_help_lists_the_option(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("sbatch", "--help").stdout
    assert re.search(r"(?m)^\s+--elastic=\[SPEC\]\s+Let slurm-elastic resize this job", out), out


@pytest.mark.slurm
def test_the_option_makes_jobs_elastic_with_their_range(
    clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=1-3\ntrue\n")
    wrap = ("--wrap", "true")
    submitted = {
        "-N1-3 --elastic": submit(clean_queue, "-N1-3", "--elastic", *wrap, cwd=tmp_path),
        "#SBATCH --elastic=1-3": submit(clean_queue, str(script), cwd=tmp_path),
        "--elastic=2-4:step=2": submit(clean_queue, "--elastic=2-4:step=2", *wrap, cwd=tmp_path),
        "no flag": submit(clean_queue, "-N1-2", *wrap, cwd=tmp_path),
    }
    ids = {name: job_id for name, (job_id, _) in submitted.items()}
    assert all(ids.values()), submitted
    allocation = subprocess.run(
        ["salloc", "--no-shell", "-p", "shared", "--elastic=1-2"],
        env=clean_queue.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    granted = re.search(r"Granted job allocation (\d+)", allocation.stderr)
    assert allocation.returncode == 0 and granted, allocation.stderr
    ids["salloc --elastic=1-2"] = int(granted[1])
    wait_until(
        lambda: set(ids.values()) <= set(clean_queue.active_job_ids()), 15, "every job listed"
    )
    rows = plan_rows(tmp_path)
    ranges = {
        name: (rows[i]["min"], rows[i]["max"], rows[i]["size_step"]) for name, i in ids.items()
    }
    assert ranges == {
        "-N1-3 --elastic": (1, 3, 1),
        "#SBATCH --elastic=1-3": (1, 3, 1),
        "--elastic=2-4:step=2": (2, 4, 2),
        "no flag": (None, None, None),
        "salloc --elastic=1-2": (1, 2, 1),
    }
    assert rows[ids["no flag"]]["target"] is None  # listed, never planned
    comment = clean_queue.run("squeue", "-h", "-j", str(ids["no flag"]), "-o", "%k").stdout
    assert comment.strip() in {"", "(null)"}


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--elastic=9-1",), "invalid --elastic=9-1: min=9 is greater than max=1"),
        (("--elastic=max=9", "-N1-3"), "invalid --elastic=max=9: max=9 disagrees with --nodes=1-3"),
        (("--elastic=min=x",), "invalid --elastic=min=x: min must be a whole number, got 'x'"),
        # Format directives (issue 38, class 4: accepted as a rigid job on 108c305).
        (("--elastic=1-2%",), "invalid --elastic=1-2%: '1-2%' is not a node range MIN-MAX"),
        (("--elastic=%s",), "invalid --elastic=%s: '%s' is not a node range MIN-MAX"),
    ],
)
def test_a_bad_spec_is_refused_at_submission(
    clean_queue: SlurmCluster, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    job_id, stderr = submit(clean_queue, *args, "--wrap", "true", cwd=tmp_path)
    assert job_id is None
    assert stderr.splitlines()[0] == f"sbatch: error: {message}", stderr
    assert clean_queue.active_job_ids() == []


@pytest.mark.slurm
def test_srun_making_the_allocation_takes_the_option(clean_queue: SlurmCluster) -> None:
    """``srun --elastic`` outside an allocation makes one, marked like ``sbatch``'s."""
    proc = subprocess.run(
        ["srun", "-p", "shared", "--elastic=1-2", "bash", "-c",
         "scontrol -o show job $SLURM_JOB_ID"],
        env=clean_queue.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\bComment=elastic:min=1,max=2\b", proc.stdout), proc.stdout
    refused = subprocess.run(
        ["srun", "-p", "shared", "--elastic=9-1", "true"],
        env=clean_queue.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "srun: error: invalid --elastic=9-1: min=9 is greater than max=1" in refused.stderr


BUILD_SPANK = Path(__file__).resolve().parent.parent / "scripts" / "build-spank.sh"


def build_spank(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SPANK), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_build_spank_installs_and_writes_the_plugstack(tmp_path: Path) -> None:
    """The admin's command, against the host's headers (libslurm-dev, scripts/install-deps.sh)."""
    so, plugstack = tmp_path / "lib" / "elastic.so", tmp_path / "etc" / "plugstack.conf"
    proc = build_spank("--out", str(so), "--plugstack", str(plugstack))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(
        rf"build-spank: built for Slurm \d\d\.\d\d\.\d+: {re.escape(str(so))}",
        proc.stdout.splitlines()[-1],
    ), proc.stdout
    assert f"PlugStackConfig={plugstack}" in proc.stdout
    assert plugstack.read_text().splitlines()[-1] == f"optional {so}"
    symbols = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True).stdout
    assert {"slurm_spank_init", "plugin_name", "plugin_version"} <= {
        line.split()[-1] for line in symbols.splitlines()
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--include", "/nonexistent"), "no /nonexistent/slurm/spank.h: install Slurm's headers"),
        (("--out", "elastic.so"), "--out must be an absolute path"),
        (("--bogus",), "unknown argument '--bogus'"),
    ],
)
def test_build_spank_refuses_with_one_line(args: tuple[str, ...], message: str) -> None:
    proc = build_spank(*args)
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr


@pytest.mark.slurm
def test_an_unprivileged_user_cannot_break_or_reach_past_the_option(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """se-bob's hostile --elastic arguments are refused with one bounded line each (a huge
    max is capped at the cluster like the marker's), and se-alice's elastic job stays as
    she submitted it."""
    alice, bob = two_users
    honest = alice.sbatch("--hold", "-p", "shared", "--elastic=1-2", "--wrap", "true")
    nodes = len(clean_queue.nodes)
    for spec in ("1-3\nelastic:min=1,max=4", "9" * 5000 + "-1", "min=x\x1b[2J"):
        proc = bob.run(
            "sbatch", "--hold", "-p", "shared", "-o", "/dev/null", f"--elastic={spec}",
            "--wrap", "true", check=False,
        )  # fmt: skip
        ours = [line for line in proc.stderr.splitlines() if "invalid --elastic" in line]
        assert proc.returncode != 0 and len(ours) == 1, proc.stderr
        assert len(ours[0]) < 300 and "\x1b" not in ours[0]
    capped = bob.sbatch("--hold", "-p", "shared", "--elastic=1-999999", "--wrap", "true")
    rows = plan_rows(tmp_path)
    assert (rows[capped]["min"], rows[capped]["max"]) == (1, nodes)
    assert (rows[honest]["min"], rows[honest]["max"], rows[honest]["user"]) == (1, 2, alice.name)
    assert set(clean_queue.active_job_ids()) == {honest, capped}
