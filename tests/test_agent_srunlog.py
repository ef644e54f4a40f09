"""srun's report of a task a planned shrink ended, told apart from a failure (agent.srunlog).

The lines are srun's own: ``srun: error: n2: task 1: Killed`` is what srun 22.05, 24.11
and 26.05 printed in the end-to-end tests' job output when the daemon shrank the job.
"""

from __future__ import annotations

import io
from pathlib import Path

from slurm_elastic.agent.launcher import _Step
from slurm_elastic.agent.srunlog import PlannedRemoval, copy_stderr, planned_end

KILLED = b"srun: error: n2: task 1: Killed\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_a_removed_nodes_task_end_during_the_shrink_is_the_shrinks() -> None:
    clock = Clock()
    removal = PlannedRemoval(clock)
    assert planned_end(KILLED, removal) is None  # no shrink under way: an error
    removal.open(("n1",), seconds=60)
    assert planned_end(KILLED, removal) == ("n2", "1")
    assert planned_end(b"srun: error: n1: task 0: Killed\n", removal) is None  # kept node
    assert planned_end(b"srun: error: n3: tasks 2-3: Terminated\n", removal) == ("n3", "2-3")
    assert planned_end(b"srun: error: n2: task 1: Exited with exit code 1\n", removal) is None
    # The node agent's own end on a stopped step's SIGTERM (agent.torchrun): 128 + 15.
    exited = b"srun: error: n3: task 0: Exited with exit code 143\n"
    assert planned_end(exited, removal) == ("n3", "0")
    assert planned_end(b"Traceback (most recent call last):\n", removal) is None
    clock.now += 61
    assert planned_end(KILLED, removal) is None  # the window closed
    removal.open((), seconds=10)  # keep nodes not named: any node's task end
    assert planned_end(KILLED, removal) == ("n2", "1")
    removal.close()
    assert planned_end(KILLED, removal) is None


def test_every_other_line_passes_unchanged() -> None:
    removal = PlannedRemoval()
    removal.open(("n1",), seconds=60)
    src = io.BytesIO(b"step 3\n" + KILLED + b"srun: error: n1: task 0: Killed\n\xff partial")
    out = io.BytesIO()
    copy_stderr(src, removal, out)
    assert out.getvalue() == b"step 3\nsrun: error: n1: task 0: Killed\n\xff partial"


def test_the_step_passes_srun_stderr_on_with_the_shrinks_task_end_as_info(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "srun"
    fake.write_text(
        "#!/bin/bash\n"
        "echo 'worker log line' >&2\n"
        "echo 'srun: error: n2: task 1: Killed' >&2\n"
        "echo 'srun: error: n1: task 0: Exited with exit code 3' >&2\n"
        "exit 137\n"
    )
    fake.chmod(0o755)
    out = io.BytesIO()
    step = _Step(out=out)
    step.removal.open(("n1",), seconds=60)
    assert step.run([str(fake)], {"PATH": "/usr/bin:/bin"}) == 137
    assert out.getvalue() == (
        b"worker log line\nsrun: error: n1: task 0: Exited with exit code 3\n"
    )
    assert not step.report.tasks_succeeded()  # not force-terminated; and n1's task failed


def fake_srun(tmp_path: Path, *lines: str, rc: int) -> Path:
    fake = tmp_path / "srun"
    fake.write_text(
        "#!/bin/bash\n" + "".join(f"echo '{line}' >&2\n" for line in lines) + f"exit {rc}\n"
    )
    fake.chmod(0o755)
    return fake


# What srun 22.05 printed (24.11 and 26.05 alike), in the signal contract's end-to-end test,
# at the end of a step whose second node a NumNodes shrink took (the first node's task
# ended with 0).
FORCE_TERMINATED = "srun: Force Terminated StepId=297.0"


def test_a_step_force_terminated_after_a_shrink_with_no_failed_task_succeeded(
    tmp_path: Path,
) -> None:
    fake = fake_srun(tmp_path, "srun: error: n2: task 1: Killed", FORCE_TERMINATED, rc=137)
    step = _Step(out=io.BytesIO())
    step.removal.open(("n1",), seconds=60)
    assert step.run([str(fake)], {"PATH": "/usr/bin:/bin"}) == 137
    assert step.report.tasks_succeeded()
    # The next run starts a new report.
    fake = fake_srun(tmp_path, "srun: error: n1: task 0: Exited with exit code 1", rc=1)
    assert step.run([str(fake)], {"PATH": "/usr/bin:/bin"}) == 1
    assert not step.report.tasks_succeeded()


def test_a_failed_task_beside_a_force_termination_is_a_failure(tmp_path: Path) -> None:
    lines = ["srun: error: n1: task 0: Exited with exit code 1", FORCE_TERMINATED]
    step = _Step(out=io.BytesIO())
    step.removal.open(("n1",), seconds=60)
    assert step.run([str(fake_srun(tmp_path, *lines, rc=137))], {"PATH": "/usr/bin:/bin"}) == 137
    assert not step.report.tasks_succeeded()
    step = _Step(out=io.BytesIO())  # a kept node's task killed (no shrink takes n1)
    lines = ["srun: error: n1: task 0: Killed", FORCE_TERMINATED]
    assert step.run([str(fake_srun(tmp_path, *lines, rc=137))], {"PATH": "/usr/bin:/bin"}) == 137
    assert not step.report.tasks_succeeded()


def test_a_launcher_told_to_stop_expects_every_task_to_end() -> None:
    step = _Step(out=io.BytesIO())
    assert not step.removal.expects("n3")
    step.forward(15, None)  # SIGTERM: a companion given back, scancel
    assert step.stopping and step.removal.expects("n3") and step.removal.expects("n1")
