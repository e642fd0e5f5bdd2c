"""What the fanned-out commands (`ingest`, `build-rows` with `--target ENGINE`) share on their
side, knowing neither: the engines and the driver are pingctl.executor's.

    step      `FanoutStep`: what a step hands the driver and the engines (its plan, where a
              task writes and its completion marker, its checks, the merge)
    task      the entry point of a task run as a process (`python -m MODULE WORK INDEX`)
    work      the driver's lock on a work directory, file descriptions and their checks
"""
