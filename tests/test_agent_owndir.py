"""agent.owndir: the job directory is read and written only as its owner left it (issue 38,
class 1: another user sharing the work directory swapped in his own job directory, and his
``launch.json`` argv ran as the job's owner).

The tests run as root, so "another user" is a directory or file chowned to another uid;
``tests/test_hostile_live.py`` runs the same attack with two real users on a real cluster.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from slurm_elastic.agent.checkpoint import atomic_write, list_checkpoints, open_checkpoint
from slurm_elastic.agent.jobdir import LaunchInfo, job_dir, read_json, write_json
from slurm_elastic.agent.owndir import OwnDir, split_trusted
from slurm_elastic.errors import AgentError

OTHER = 65534  # nobody: another user's files


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A work directory anyone may write, as /tmp or a site's /scratch (mode 1777)."""
    tmp_path.chmod(0o1777)
    return tmp_path


def test_the_trusted_part_starts_at_the_slurm_elastic_directory() -> None:
    assert split_trusted(Path("/scratch/a/.slurm-elastic/job-7/checkpoints")) == (
        Path("/scratch/a"),
        (".slurm-elastic", "job-7", "checkpoints"),
    )
    assert split_trusted(Path("/home/a/ckpts")) == (Path("/home/a"), ("ckpts",))


def test_directories_are_made_0700_and_files_0600_whatever_the_umask(work: Path) -> None:
    directory = job_dir(work, 7)
    old = os.umask(0)
    try:
        write_json(directory / "launch.json", {"argv": ["train.py"]})
    finally:
        os.umask(old)
    assert (work / ".slurm-elastic").stat().st_mode & 0o7777 == 0o700
    assert directory.stat().st_mode & 0o7777 == 0o700
    assert (directory / "launch.json").stat().st_mode & 0o7777 == 0o600
    assert read_json(directory / "launch.json") == {"argv": ["train.py"]}


def test_a_slurm_elastic_directory_another_user_made_first_is_refused(work: Path) -> None:
    """Bob pre-creates ``.slurm-elastic`` (mode 777) in the shared directory: nothing of
    alice's is written there, and reading says what to do."""
    planted = work / ".slurm-elastic"
    planted.mkdir()
    planted.chmod(0o777)
    os.chown(planted, OTHER, OTHER)
    with pytest.raises(AgentError, match=r"\.slurm-elastic belongs to uid 65534, not to you"):
        OwnDir(job_dir(work, 7)).ensure()
    assert list(planted.iterdir()) == []
    with pytest.raises(AgentError, match="use a work directory of your own"):
        read_json(job_dir(work, 7) / "launch.json")


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write_is_refused(work: Path, mode: int) -> None:
    directory = job_dir(work, 7)
    OwnDir(directory).ensure()
    directory.chmod(mode)
    with pytest.raises(
        AgentError, match=rf"job-7 may be written by other users \(mode {mode:04o}\)"
    ):
        read_json(directory / "launch.json")


def test_links_are_never_followed(work: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A link where a directory or file of the job's should be (to a directory bob owns, or
    to a file of his) is refused at every level."""
    bobs = tmp_path_factory.mktemp("bob")
    write_json(bobs / "job-7" / "launch.json", {"argv": ["evil"]})
    (work / ".slurm-elastic").symlink_to(bobs)
    with pytest.raises(AgentError, match=r"\.slurm-elastic is not a directory of yours \(a link"):
        LaunchInfo.load(job_dir(work, 7))
    (work / ".slurm-elastic").unlink()
    OwnDir(job_dir(work, 8)).ensure()
    (work / ".slurm-elastic" / "job-7").symlink_to(bobs / "job-7")
    with pytest.raises(AgentError, match=r"job-7 is not a directory of yours \(a link"):
        LaunchInfo.load(job_dir(work, 7))
    (job_dir(work, 8) / "launch.json").symlink_to(bobs / "job-7" / "launch.json")
    with pytest.raises(AgentError, match=r"launch\.json is a link, not a file of yours"):
        LaunchInfo.load(job_dir(work, 8))


def test_a_file_of_another_users_is_refused(work: Path) -> None:
    path = job_dir(work, 7) / "control.json"
    write_json(path, {"seq": 1, "action": "hold"})
    os.chown(path, OTHER, OTHER)
    with pytest.raises(AgentError, match=r"control\.json belongs to uid 65534"):
        read_json(path)
    path.chmod(0o600)
    os.chown(path, os.geteuid(), -1)
    path.chmod(0o646)
    with pytest.raises(AgentError, match="may be written by other users"):
        read_json(path)


def test_a_checkpoint_is_unpickled_only_from_the_owners_directory(work: Path) -> None:
    directory = job_dir(work, 7) / "checkpoints"
    atomic_write(directory / "ckpt-00000010.pt", lambda handle: handle.write(b"state"))
    ((step, path),) = list_checkpoints(directory)
    with open_checkpoint(path) as handle:
        assert (step, handle.read()) == (10, b"state")
    os.chown(path, OTHER, OTHER)
    with pytest.raises(AgentError, match="belongs to uid 65534"):
        open_checkpoint(path)


def test_a_directory_swapped_after_a_check_is_refused_at_the_next_access(work: Path) -> None:
    """Checked is what is used: each access walks again, so a job directory renamed away and
    replaced by another user's between two reads is never followed (the attack raced the
    job's first write; here the swap is made between accesses, deterministically)."""
    own = OwnDir(job_dir(work, 7))
    write_json(job_dir(work, 7) / "launch.json", {"argv": ["train.py"]})
    assert own.read("launch.json") is not None
    os.rename(work / ".slurm-elastic", work / "moved")
    planted = work / ".slurm-elastic" / "job-7"
    write_json(planted / "launch.json", {"argv": ["evil"]})
    os.chown(work / ".slurm-elastic", OTHER, OTHER)
    with pytest.raises(AgentError, match="belongs to uid 65534"):
        own.read("launch.json")


def test_a_racing_swapper_never_gets_a_read_of_a_foreign_file(work: Path) -> None:
    """While another thread swaps the job directory for a foreign one and back as fast as
    it can, every read returns the owner's file or refuses: never the planted one."""
    write_json(job_dir(work, 7) / "launch.json", {"argv": ["train.py"]})
    foreign = work / "foreign"  # another user's look-alike, swapped in and out
    (foreign / "job-7").mkdir(parents=True, mode=0o700)
    (foreign / "job-7" / "launch.json").write_text('{"argv": ["evil"]}')
    (foreign / "job-7" / "launch.json").chmod(0o600)
    for path in (foreign, foreign / "job-7", foreign / "job-7" / "launch.json"):
        os.chown(path, OTHER, OTHER)
    mine = work / "mine"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(work / ".slurm-elastic", mine)
            os.rename(foreign, work / ".slurm-elastic")
            os.rename(work / ".slurm-elastic", foreign)
            os.rename(mine, work / ".slurm-elastic")

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: set[str] = set()
    try:
        for _ in range(2000):
            try:
                data = read_json(job_dir(work, 7) / "launch.json")
            except AgentError as exc:
                seen.add("refused" if "belongs to uid 65534" in str(exc) else str(exc))
                continue
            seen.add("missing" if data is None else data["argv"][0])
    finally:
        stop.set()
        swapper.join()
    assert "evil" not in seen, seen
    assert seen <= {"train.py", "refused", "missing"}, seen
