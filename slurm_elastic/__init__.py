"""slurm-elastic: elastic deep-learning training on stock Slurm.

Importing this package must stay cheap and must never import torch: the head
node runs the daemon without GPUs or torch.  torch is imported only by
``slurm_elastic.agent.torch`` (the ``agent`` extra).
"""

__version__ = "0.1.0"
