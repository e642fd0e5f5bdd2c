"""The SLURM engine, all of it (docs/ingest.md "Fanned out", docs/train.md "SLURM"):

    engine     `SlurmExecutor`: every call to sbatch/squeue/scontrol/sacct/scancel; fan-out as a
               job array, training as one job (submit, `--status`, `--follow`)
    job        the training job's sbatch script (`render_sbatch`) and the job's own entry point,
               `python -m pingctl.executor.slurm.job RUN_DIR`, which the script runs
"""
