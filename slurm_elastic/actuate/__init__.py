"""Actuation: from a plan to guarded, journaled changes in Slurm.

* ``state``     -- classify a snapshot's jobs: elastic (companions folded in), companion, other;
* ``diff``      -- plan minus reality = actions (pure), plus companion housekeeping;
* ``guards``    -- guard rails as pure functions with named knobs;
* ``companion`` -- the companion job: its comment link, script and orphan rule;
* ``executor``  -- applies actions journal-first; the graceful-shrink state machine.
"""
