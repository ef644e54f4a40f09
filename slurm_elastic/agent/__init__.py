"""The job side: what runs inside an elastic Slurm job.

torch-free (importable on the head node and by ``slurm-elastic --help``):

* ``launcher`` / ``cli``  ``slurm-elastic run``: launch.json, srun of the node agents, relaunch
* ``node``                what srun runs per node: the torchrun command, then ``exec``
* ``follower``            the daemon's shrink instructions: hold, ack, resume
* ``rendezvous``          torchrun arguments and the job's rendezvous port
* ``allocation``          the job's current allocation and the environment a new srun needs
* ``jobdir``              the files shared by launcher, workers and companions
* ``sampler`` / ``batching`` / ``checkpoint`` / ``progress`` / ``samplelog``  library parts

torch: ``agent.torch`` (``ElasticTrainer``), imported only by training scripts.
"""
