"""What a reader of the daemon's status may see: Slurm's own visibility rules (pure).

The status document (``daemon.status``) describes every job the daemon sees, as root sees
them.  Served as it is, it would show a user what slurm.conf's ``PrivateData`` hides from
him: with ``PrivateData=jobs`` se-bob's ``squeue`` lists only his own jobs and ``scontrol
show job`` says "Invalid job id" for se-alice's, but the daemon's ``GET /v1/status`` showed
her job's name, user, size, step and rate.  So every reader gets the document Slurm would
let them see (``visible``):

* nothing is private (``PrivateData`` none, or only words that hide nothing the document
  holds): everyone sees everything, as in ``squeue``;
* ``jobs`` or ``users`` private: a reader sees only the rows of jobs of his own -- job rows,
  plan decisions and their explanations, actions, reclaims between two of his jobs -- and
  the loans summed over them; an unauthenticated reader (no MUNGE credential) sees no job
  at all.  Root, SlurmUser and Slurm's operators and administrators (AdminLevel) see
  everything, as they do in Slurm;
* ``partitions`` private: the per-partition GPU types are shown only to those who see
  everything (a partition's name is what it hides);
* ``accounts``, ``usage``, ``nodes``, ``events``, ``reservations``, ``cloud``: the document
  holds no account, fair-share usage, node name, event or reservation, so nothing more is
  hidden.

What the daemon does not know (Slurm not probed yet) is treated as private: fewer see
more, never the other way round.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_elastic.daemon.auth import ROOT_UID

# PrivateData words that hide other users' jobs (and so every row about them).
_HIDES_JOBS = frozenset({"jobs", "users"})


@dataclass(frozen=True, slots=True)
class Privacy:
    """What Slurm keeps private; ``known`` False until Slurm has said (then as private as
    can be)."""

    words: frozenset[str] = frozenset()
    known: bool = True
    slurm_user: str = ""
    admins: frozenset[str] = frozenset()

    @classmethod
    def unknown(cls) -> Privacy:
        return cls(known=False)

    @classmethod
    def of(cls, words: Iterable[str], slurm_user: str = "", admins: Iterable[str] = ()) -> Privacy:
        return cls(frozenset(words), True, slurm_user, frozenset(admins))

    @property
    def hides_jobs(self) -> bool:
        return not self.known or bool(self.words & _HIDES_JOBS)

    @property
    def hides_partitions(self) -> bool:
        return not self.known or "partitions" in self.words

    @property
    def hides_anything(self) -> bool:
        return self.hides_jobs or self.hides_partitions


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who reads: ``uid`` and ``user`` None for an unauthenticated reader."""

    uid: int | None = None
    user: str | None = None

    def sees_all(self, privacy: Privacy) -> bool:
        if self.uid == ROOT_UID:
            return True
        return self.user is not None and (
            self.user == privacy.slurm_user or self.user in privacy.admins
        )


ANYONE = Viewer()


def visible(document: Mapping[str, Any], viewer: Viewer, privacy: Privacy) -> dict[str, Any]:
    """The part of ``document`` that ``viewer`` may see (module doc); a copy."""
    out = copy.deepcopy(dict(document))
    if viewer.sees_all(privacy):
        return out
    if privacy.hides_partitions:
        out.pop("gpu_types", None)
    if not privacy.hides_jobs:
        return out
    rows = out.get("jobs") or []
    mine = {
        row.get("job_id")
        for row in rows
        if viewer.user is not None and isinstance(row, dict) and row.get("user") == viewer.user
    }
    out["jobs"] = [row for row in rows if isinstance(row, dict) and row.get("job_id") in mine]
    plan = out.get("plan")
    if isinstance(plan, dict):
        plan["decisions"] = [
            d
            for d in plan.get("decisions") or []
            if isinstance(d, dict) and d.get("job_id") in mine
        ]
        # The solver's figures are over every job: not the reader's to see.
        for key in ("objective", "gap"):
            if key in plan:
                plan[key] = None
    out["actions"] = [
        a for a in out.get("actions") or [] if isinstance(a, dict) and a.get("job_id") in mine
    ]
    if "reclaims" in out:
        out["reclaims"] = [
            r
            for r in out.get("reclaims") or []
            if isinstance(r, dict) and r.get("borrower") in mine and r.get("waiting_job") in mine
        ]
    if "nodes_on_loan" in out:
        out["nodes_on_loan"] = sum(int(row.get("loan") or 0) for row in out["jobs"])
    out["private"] = "jobs of other users are hidden (slurm.conf PrivateData)"
    return out
