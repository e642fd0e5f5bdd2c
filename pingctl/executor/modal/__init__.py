"""The Modal engine, all of it (docs/ingest.md "Fanned out", docs/train.md "Modal"):

    engine     `ModalExecutor`: fan-out (a Modal map over the tasks, behind the small `Boundary`
               interface) and training (delegated to `run`)
    image      the image: pingctl's requirements, pingctl itself added from this interpreter
    app        `train --target modal`'s app and function, built offline; `--dry-run`'s description
    container  what runs in the training container
    run        `train --target modal` from the submitting machine: submit, `--status`, `--follow`
    sync       what a submission uploads to the volume, remote names, `--fresh` deletion
    pull       `pingctl pull` (and the pull at the end of a blocking or followed run)
    volume     `Volume`, the interface the above speak, and `ModalVolume` on `modal.Volume`

Nothing here imports Modal at import time: `modal` is imported inside the functions that call it.
"""
