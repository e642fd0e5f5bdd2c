"""`pingctl ingest --target ENGINE`: one task per input file elsewhere (a SLURM job array, a
Modal map, any engine of pingctl.executor), then one merge here (docs/ingest.md, "Fanned out").

    work      the work directory beside the output, the plan, each task and the merge:
              the same per-file code (`core.ingest_file`) and the same way of finishing the
              output (`core.write_output`) as a local run, so the output is the same
    task      `python -m pingctl.ingest.fanout.task WORK INDEX`: one task (a SLURM array task)
    step      the ingest as a `FanoutStep` (pingctl.fanout.step): what the driver
              (pingctl.executor.fanout) and the engines are handed
"""
