"""Actuation: from a plan to guarded, journaled changes in Slurm.

* ``state``     -- classify a snapshot's jobs: elastic (companions folded in), companion, other;
* ``diff``      -- plan minus reality = actions (pure), plus companion housekeeping;
* ``guards``    -- guard rails as pure functions with named knobs;
* ``companion`` -- the companion job: its comment link, script and orphan rule;
* ``journal``   -- storage of every action before it is applied (SQLite; ``JournalStore``);
* ``reconcile`` -- crash recovery: open journal rows closed against Slurm, orphans cancelled;
* ``executor``  -- applies actions journal-first; the graceful-shrink state machine.
"""
