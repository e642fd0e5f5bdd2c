"""`pingctl ingest --target slurm|modal`: one task per input file on a cluster or on Modal, then
one merge here (docs/ingest.md, "Fanned out").

    work      the work directory beside the output, the plan, each task and the merge:
              the same per-file code (`core.ingest_file`) and the same way of finishing the
              output (`core.write_output`) as a local run, so the output is the same
    task      `python -m pingctl.ingest.fanout.task WORK INDEX`: one task (a SLURM array task)
    slurm     the job-array script (pingctl/templates/ingest_array.sh.j2) on the shared
              engine (pingctl.fanout.slurm: sbatch, squeue, cancel, failures)
    modal     the Modal function mapped over the inputs and the volume it writes to, behind
              the small boundary of pingctl.fanout.modal a local directory can stand in for
    driver    plan -> run what is missing -> merge, for either engine
"""
