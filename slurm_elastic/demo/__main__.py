"""``python -m slurm_elastic.demo`` (what ``make demo`` runs)."""

from slurm_elastic.demo.cli import demo

demo()
