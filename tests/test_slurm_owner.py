"""slurm.owner: the environment, umask and options of a job submitted as its owner."""

from __future__ import annotations

import grp
import pwd
from pathlib import Path

import pytest

from slurm_elastic.slurm.owner import login_umask, submit_environment, submit_prefix


def entry(name: str, uid: int, gid: int, home: str = "/home/x") -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", home, "/bin/bash"))


def private_user() -> pwd.struct_passwd:
    """A user of this machine whose primary group is its own (root is, on Debian)."""
    root = pwd.getpwuid(0)
    assert grp.getgrgid(root.pw_gid).gr_name == root.pw_name
    return root


@pytest.mark.parametrize(
    ("defs", "expected"),
    [
        ("UMASK\t\t022\nUSERGROUPS_ENAB yes\n", 0o002),  # Debian's defaults
        ("UMASK 027\nUSERGROUPS_ENAB yes\n", 0o007),
        ("UMASK 077\nUSERGROUPS_ENAB no\n", 0o077),
        ("# UMASK 077\n", 0o022),  # a comment is no setting: login's default
        ("UMASK nonsense\n", 0o022),
    ],
)
def test_login_umask_follows_login_defs(tmp_path: Path, defs: str, expected: int) -> None:
    path = tmp_path / "login.defs"
    path.write_text(defs)
    assert login_umask(private_user(), path) == expected


def test_login_umask_keeps_group_bits_for_a_shared_group(tmp_path: Path) -> None:
    path = tmp_path / "login.defs"
    path.write_text("UMASK 022\nUSERGROUPS_ENAB yes\n")
    shared = entry("someone-else", 0, 0)  # gid 0's group is not named after this user
    assert login_umask(shared, path) == 0o022
    assert login_umask(shared, tmp_path / "missing") == 0o022


def test_submit_environment_holds_only_the_named_variables() -> None:
    alice = entry("alice", 1001, 1001, "/home/alice")
    env = submit_environment(alice, "/etc/slurm/x.conf", path="/usr/sbin:/usr/bin")
    assert set(env) == {"PATH", "HOME", "USER", "LOGNAME", "SLURM_UMASK", "SLURM_CONF"}
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/home/alice", "alice", "alice")
    assert "SLURM_CONF" not in submit_environment(alice, None, path="/usr/bin")
    prefix = submit_prefix({"PATH": "/usr/bin", "HOME": "/home/alice"})
    assert prefix == ("env", "-i", "PATH=/usr/bin", "HOME=/home/alice")
