"""How the agent is started: ``connect`` (dial back to the supervisor, a sealed channel via ``relay``),
``slurm`` (a task of an srun step: rank and TF_CONFIG from Slurm's variables, ``hostlist``), and
``kubernetes`` (a pod's main process; its log is the channel). Each ends in the same ``Runner``."""
