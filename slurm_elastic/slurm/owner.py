"""What a job submitted *as its owner* (a companion job) takes from the root daemon: nothing.

The daemon runs ``sbatch`` as the owner (``runuser -u OWNER --``), and ``sbatch`` passes on
whatever its own process has: by default every environment variable (``--export=ALL``), its
resource limits (``PropagateResourceLimits``) and its umask (``SLURM_UMASK``).  From a
root service that is the operator's unit environment (tokens, proxies), root's ``PATH``,
systemd's raised limits and the daemon's umask -- none of them the user's business.  So a
companion is submitted

* with ``--export=NONE``: the job starts from its owner's *login* environment on the node
  (Slurm runs the owner's login shell there to read it, as for ``--get-user-env``) plus
  Slurm's own ``SLURM_*`` job variables.  ``sbatch`` still forwards the ``SLURM_*``
  variables of its own process, so that process gets a fresh environment (``env -i``) with
  only :func:`submit_environment`'s names: ``PATH`` to find ``runuser`` and ``sbatch``
  (not exported to the job), the owner's ``HOME``/``USER``/``LOGNAME``, ``SLURM_CONF``
  when the daemon names one (the job must reach the same cluster) and ``SLURM_UMASK``;
* with ``--propagate=NONE``: the job gets the limits the node gives every job (slurmd's,
  and the owner's PAM limits where slurmd uses PAM), never the daemon's;
* with ``SLURM_UMASK`` set to the owner's login umask (:func:`login_umask`), never the
  daemon's.

The job side needs nothing else to find its parent: the companion's script names the parent
(``--join PARENT``) and runs in the parent's working directory, whose job directory holds
what joining takes (``agent.jobdir``).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["LOGIN_DEFS", "SUBMIT_OPTIONS", "login_umask", "submit_environment", "submit_prefix"]

LOGIN_DEFS = Path("/etc/login.defs")
# sbatch options of every job the daemon submits as a user (see the module docstring).
SUBMIT_OPTIONS = ("--export=NONE", "--propagate=NONE")
DEFAULT_UMASK = 0o022  # login.defs' own default when it names none
_SETTING = re.compile(r"^\s*([A-Z_]+)\s+(\S+)")


def _login_defs(path: Path) -> Mapping[str, str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return {m[1]: m[2] for line in text.splitlines() if (m := _SETTING.match(line))}


def login_umask(entry: pwd.struct_passwd, login_defs: Path = LOGIN_DEFS) -> int:
    """The umask a login of ``entry``'s user gets from ``login.defs``, as shadow's ``login``
    and ``su -`` compute it: ``UMASK`` (022 when unset or unreadable), and with
    ``USERGROUPS_ENAB yes`` a user whose primary group is their own private group (same id,
    same name) gets the group bits equal to the user bits (022 -> 002)."""
    settings = _login_defs(login_defs)
    try:
        mask = int(settings.get("UMASK", ""), 8) & 0o777
    except ValueError:
        mask = DEFAULT_UMASK
    if settings.get("USERGROUPS_ENAB", "").lower() == "yes" and entry.pw_uid == entry.pw_gid:
        try:
            private = grp.getgrgid(entry.pw_gid).gr_name == entry.pw_name
        except KeyError:
            private = False
        if private:
            mask = (mask & ~0o070) | ((mask & 0o700) >> 3)
    return mask


def submit_environment(
    entry: pwd.struct_passwd, slurm_conf: str | None, path: str | None = None
) -> dict[str, str]:
    """The whole environment of an ``sbatch`` run as ``entry``'s user for the daemon."""
    env = {
        "PATH": path if path is not None else os.environ.get("PATH", os.defpath),
        "HOME": entry.pw_dir,
        "USER": entry.pw_name,
        "LOGNAME": entry.pw_name,
        "SLURM_UMASK": f"{login_umask(entry):04o}",
    }
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


def submit_prefix(env: Mapping[str, str]) -> tuple[str, ...]:
    """``env -i NAME=value ...``: the command that follows sees exactly ``env``."""
    return ("env", "-i", *(f"{name}={value}" for name, value in env.items()))
