"""Issue 38, class 1, with two real unprivileged users: se-bob shares se-alice's work
directory (mode 1777, as /tmp or a site's /scratch) and tries to make her job read what he
wrote -- first by making ``.slurm-elastic`` before her job does, then by racing her job's
writes and reads with renames and plants of his own.

On 108c305 either attack put his ``launch.json`` (its argv runs on every node and in the
companions the daemon submits as her) in her job's path.  Here her side is the job side's
one access layer (``agent.owndir``, with ``agent.checkpoint`` over it), run as se-alice by
the system's Python, which needs nothing but the standard library for it: a copy of those
modules is put where she can read them.  No Slurm is involved: the attack is on the file
system every node shares, whatever the version (tests/test_agent_owndir.py has the same
checks as root, with files chowned to another uid).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import TEST_USERS, in_ci

REPO = Path(__file__).resolve().parent.parent
# What se-alice's side imports: the access layer and what it imports, standard library only.
MODULES = (
    "slurm_elastic/__init__.py",
    "slurm_elastic/errors.py",
    "slurm_elastic/agent/__init__.py",
    "slurm_elastic/agent/owndir.py",
    "slurm_elastic/agent/checkpoint.py",
)
SYSTEM_PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"

# se-alice's job: write launch.json and a checkpoint, read them back, many times; print one
# line per access: "mine", "refused <reason>" or "FOREIGN <what was read>".
ALICE = r"""
import sys
from pathlib import Path
from slurm_elastic.agent.owndir import OwnDir
from slurm_elastic.agent.checkpoint import atomic_write, list_checkpoints, open_checkpoint
from slurm_elastic.errors import AgentError

work, rounds = Path(sys.argv[1]), int(sys.argv[2])
name = sys.argv[3] if len(sys.argv) > 3 else "job-7"
job = OwnDir(work / ".slurm-elastic" / name)
for i in range(rounds):
    try:
        job.write("launch.json", lambda h: h.write(b'{"argv": ["train.py"]}'))
        got = job.read("launch.json")
        print("mine" if got == b'{"argv": ["train.py"]}' else f"FOREIGN {got!r}")
        ckpts = work / ".slurm-elastic" / name / "checkpoints"
        atomic_write(ckpts / "ckpt-00000001.pt", lambda h: h.write(b"alice"))
        for _, path in list_checkpoints(ckpts):
            with open_checkpoint(path) as h:
                data = h.read()
            print("mine" if data == b"alice" else f"FOREIGN {data!r}")
    except AgentError as exc:
        print("refused " + str(exc).replace("\n", " "))
"""

# se-bob, for as long as se-alice's job runs: take her directories away, plant his own
# (in the job directories named after the work directory, job-7 when none is named).
BOB = r"""
w=$1; shift; [ $# -gt 0 ] || set -- job-7
n=0
while [ ! -e "$w/stop" ] && [ $n -lt 20000 ]; do
    n=$((n + 1))
    mv "$w/.slurm-elastic" "$w/b$n" 2>/dev/null
    for j in "$@"; do
        mv "$w/.slurm-elastic/$j" "$w/b$n-$j" 2>/dev/null
        mkdir -p "$w/.slurm-elastic/$j/checkpoints" 2>/dev/null
        chmod 777 "$w/.slurm-elastic" "$w/.slurm-elastic/$j" 2>/dev/null
        echo '{"argv": ["evil"]}' > "$w/.slurm-elastic/$j/launch.json" 2>/dev/null
        echo bob > "$w/.slurm-elastic/$j/checkpoints/ckpt-00000001.pt" 2>/dev/null
    done
    ln -s "$w/b$n" "$w/.slurm-elastic/job-8" 2>/dev/null
done
"""


@pytest.fixture
def users() -> tuple[str, str]:
    for name in TEST_USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            if in_ci():
                pytest.fail(f"no local user {name}: scripts/install-deps.sh makes them")
            pytest.skip(f"no local user {name} (make setup)")
    if os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip("needs root (to act as two users) and the system's python3")
    return TEST_USERS[0], TEST_USERS[1]


def shared_tree(top: Path, scripts: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Under ``top`` (mode 0755): a work directory anyone may write, mode 1777, and the
    modules se-alice imports (with ``scripts``, by name), which anyone may read."""
    top.chmod(0o755)
    code = top / "code"
    for module in MODULES:
        (code / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / module, code / module)
    for name, text in (scripts or {}).items():
        (code / name).write_text(text)
    for path in [code, *code.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    work = top / "work"
    work.mkdir()
    work.chmod(0o1777)
    return work, code


@pytest.fixture
def shared() -> Iterator[tuple[Path, Path]]:
    """(a work directory anyone may write, mode 1777; the modules se-alice imports)."""
    top = Path(tempfile.mkdtemp(prefix="se-jobdir-"))
    try:
        yield shared_tree(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_user(user: str, *argv: str, code: Path, timeout: float = 120.0) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(code), "HOME": "/", "LANG": "C.UTF-8"}
    proc = subprocess.run(
        [RUNUSER, "-u", user, "--", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_a_slurm_elastic_directory_made_first_by_another_user_is_refused(
    users: tuple[str, str], shared: tuple[Path, Path]
) -> None:
    alice, bob = users
    work, code = shared
    as_user(bob, "mkdir", "-m", "777", str(work / ".slurm-elastic"), code=code)
    script = work.parent / "alice.py"
    script.write_text(ALICE)
    script.chmod(0o644)
    lines = as_user(alice, SYSTEM_PYTHON, str(script), str(work), "1", code=code)
    uid = pwd.getpwnam(bob).pw_uid
    assert lines == [
        f"refused {work}/.slurm-elastic belongs to uid {uid}, not to you (uid "
        f"{pwd.getpwnam(alice).pw_uid}): another user made it in a shared work directory; "
        "use a work directory of your own (sbatch --chdir) or have it removed"
    ], lines
    assert list((work / ".slurm-elastic").iterdir()) == []  # nothing of hers went there


def test_a_racing_second_user_never_gets_his_files_read(
    users: tuple[str, str], shared: tuple[Path, Path]
) -> None:
    alice, bob = users
    work, code = shared
    script = work.parent / "alice.py"
    script.write_text(ALICE)
    bob_script = work.parent / "bob.sh"
    bob_script.write_text(BOB)
    for path in (script, bob_script):
        path.chmod(0o644)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
    racer = subprocess.Popen(
        [RUNUSER, "-u", bob, "--", "sh", str(bob_script), str(work)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lines = as_user(alice, SYSTEM_PYTHON, str(script), str(work), "300", code=code)
    finally:
        (work / "stop").touch()
        racer.wait(timeout=60)
    foreign = [line for line in lines if line.startswith("FOREIGN")]
    assert foreign == [], foreign[:5]
    kinds = {line.split(" ", 1)[0] for line in lines}
    assert kinds <= {"mine", "refused"}, kinds
    # While his .slurm-elastic is there her job is refused (he may move his own away, and
    # hers may then be made); once hers is there he cannot take it away (the sticky bit,
    # mode 0700): from her first good access on, every access is hers.
    if "mine" in lines:
        after = lines[lines.index("mine") :]
        assert set(after) == {"mine"}, [line for line in after if line != "mine"][:3]
    for line in lines:
        if line.startswith("refused"):
            assert "\n" not in line and "belongs to uid" in line, line
