"""A per-rank log of which samples each step trained on, and what it tells after the fact.

The example writes one JSON line per rank per step *before* applying the step (so a step
under way when a group breaks up is logged too).  Readers reconstruct what the final model
actually learned from: for each step, the records of the latest *generation* (one process
group, numbered by rank 0's start time) that ran it — an older generation's records of a
step are superseded when a newer group restored a checkpoint from before it and redid it.

Used by the end-to-end tests (exactly once per epoch, steps lost), by
``scripts/bench_resize.py`` (time to the first step at a new size) and by the demo's summary
(the survivors' pauses).  No torch: written on the job side, read on the head node too.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


class SampleLog:
    """Writer: ``samples-g<generation>-r<rank>.jsonl`` in ``directory``."""

    def __init__(self, directory: str | Path, generation: int, rank: int) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.generation = generation
        self.rank = rank
        self._handle: TextIO = open(path / f"samples-g{generation}-r{rank}.jsonl", "a")  # noqa: SIM115

    def write(
        self,
        *,
        step: int,
        epoch: int,
        world: int,
        nodes: int,
        indices: list[int],
        generation: int | None = None,
        rank: int | None = None,
    ) -> None:
        """One step's record; ``generation`` and ``rank`` when they change from step to step
        (the torchft mode's quorum and place in it), else the log's own."""
        record = {
            "gen": self.generation if generation is None else generation,
            "step": step,
            "epoch": epoch,
            "rank": self.rank if rank is None else rank,
            "world": world,
            "nodes": nodes,
            "idx": indices,
            "t": time.time(),
            "pid": os.getpid(),
            "node": os.environ.get("SLURMD_NODENAME", ""),
        }
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()


def read_records(directory: str | Path) -> list[dict[str, Any]]:
    """Every complete line of every rank's log."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("samples-*.jsonl")):
        with open(path) as handle:
            out += [json.loads(line) for line in handle if line.endswith("\n")]
    return out


def lineage(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per step, the records of the latest generation that ran it (what the model kept)."""
    by_step: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_step[r["step"]][r["gen"]].append(r)
    return {step: gens[max(gens)] for step, gens in sorted(by_step.items())}


def samples_per_epoch(records: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Samples the final model trained on, per epoch (duplicates kept, to be detected)."""
    seen: dict[int, list[int]] = defaultdict(list)
    for rows in lineage(records).values():
        for r in rows:
            seen[r["epoch"]] += r["idx"]
    return dict(seen)


def steps_lost(records: list[dict[str, Any]]) -> list[int]:
    """Per change of generation: steps the old group's rank 0 ran that the new one redid."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for r in records:
        if r["rank"] == 0:
            first[r["gen"]] = min(first.get(r["gen"], r["step"]), r["step"])
            last[r["gen"]] = max(last.get(r["gen"], r["step"]), r["step"])
    gens = sorted(first)
    return [last[a] + 1 - first[b] for a, b in itertools.pairwise(gens)]


def first_time_at(records: list[dict[str, Any]], world: int, after: float) -> float | None:
    """When the first step at world size ``world`` started after time ``after``."""
    times = [r["t"] for r in records if r["world"] == world and r["t"] >= after]
    return min(times) if times else None


@dataclass(frozen=True, slots=True)
class Pause:
    """What one node's worker felt at one change of the job's size."""

    node: str
    at: float  # its first step at the new size (POSIX s)
    from_world: int
    to_world: int
    seconds: float  # from its last step at the old size to its first at the new one
    restarted: bool  # that first step came from a process the node had not run before


def survivor_pauses(records: list[dict[str, Any]]) -> list[Pause]:
    """Per node that trained on both sides of a change of world size, the pause it saw.

    A node that left and came back later (its step jumps ahead) did not survive the change
    and is not counted.  Under torchrun every survivor restarts (``restarted``); in the
    torchft mode none should.  Sorted by time.
    """
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_node[r["node"]].append(r)
    pauses: list[Pause] = []
    for node, rows in by_node.items():
        rows.sort(key=lambda r: r["t"])
        seen_pids: set[int] = set()
        for before, after in itertools.pairwise(rows):
            seen_pids.add(before["pid"])
            if before["world"] != after["world"] and after["step"] <= before["step"] + 1:
                pauses.append(
                    Pause(
                        node=node,
                        at=after["t"],
                        from_world=before["world"],
                        to_world=after["world"],
                        seconds=after["t"] - before["t"],
                        restarted=after["pid"] not in seen_pids,
                    )
                )
    return sorted(pauses, key=lambda p: p.at)
