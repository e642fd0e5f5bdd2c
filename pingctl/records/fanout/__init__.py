"""`pingctl build-rows --target ENGINE`: one task per hash partition of the probes elsewhere (a
SLURM job array, a Modal map, any engine of pingctl.executor), then one merge here (docs/rows.md,
"Fanned out").

    work      the work directory beside the output, the plan, each task and the merge: the
              same grouping and record code as a local build (`records.build`)
    task      `python -m pingctl.records.fanout.task WORK INDEX`: one task (a SLURM array task)
    step      the build as a `FanoutStep` (pingctl.fanout.step): what the driver
              (pingctl.executor.fanout) and the engines are handed
"""
