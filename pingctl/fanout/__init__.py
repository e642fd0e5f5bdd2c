"""The engines that fan one command out into tasks elsewhere, shared by `ingest` and
`build-rows` (`--target slurm|modal`): what they have in common and nothing of either.

    slurm     job arrays: the array spec, sbatch, squeue polling, cancel, what SLURM says of a
              failed task and where its log is; the caller renders its own script
    modal     the boundary with Modal (upload, map a task function, download, remove), on the
              Modal SDK or on a local directory standing in for the volume
    work      the driver's lock on a work directory, file descriptions and their checks
"""
