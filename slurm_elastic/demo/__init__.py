"""``make demo``: the whole system on the local cluster, in about five minutes.

``python -m slurm_elastic.demo [--quick] [--instance K] [--out DIR]`` brings up (or reuses)
the local Slurm cluster, starts the daemon in enforce mode, submits a mixed workload of
elastic torch jobs and rigid jobs arriving over a few minutes, shows ``slurm-elastic
status`` while the daemon starts jobs at size, shrinks and grows them, and writes
``DIR/summary.json`` and ``DIR/timeline.png``.

Modules: ``workload`` (the job mix), ``harness`` (cluster, config, daemon process),
``observe`` (sizes from squeue), ``session`` (the run and its clean stop), ``compare``
(the same mix simulated under the static policy), ``report`` (summary and plot), ``cli``.
"""
