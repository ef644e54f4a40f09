"""Progress models: what one more (or one fewer) node buys each elastic job.

* ``convergence`` -- loss curves fitted online (Optimus by default; power law and exponential
  saturation chosen per job by a holdout on its own prefix); steps to a criterion.
* ``throughput``  -- step time vs node count, ridge-fitted toward a prior; Pollux goodput.
* ``priors``      -- cold-start estimates from similar jobs in the site's sacct history.
* ``outlook``     -- per-job incremental state (``ModelBank``) and the pure
  ``estimate_outlook`` that produces ``types.Outlook`` for the policies.

Nothing is imported here so that ``import slurm_elastic.model`` stays cheap.
"""
