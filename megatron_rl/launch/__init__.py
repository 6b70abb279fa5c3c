"""Launchers: ``megatron-rl slurm submit`` writes and submits the sbatch script of ``slurm/``;
``megatron-rl slurm wait-nodes`` is the step of that script that waits for every node's Ray worker."""
