"""What pingctl commands write and read on disk, one module per artifact kind, and the only
code that knows their layout:

- `table`: canonical Parquet tables and `pingctl shard`'s splits directory;
- `records`: a `pingctl build-rows` output (manifest, ArrayRecord files);
- `run`: a `pingctl train` run directory (config, checkpoints, summary, metrics);
- `remote`: a run's `remote.json` (where it was submitted off this machine: SLURM, Modal);
- `eval_output`: a `pingctl eval` output (report.json);
- `sample_output`: what `pingctl sample` writes (predictions, one pair's distribution).

Every other module reaches these files through them (docs/data.md, docs/rows.md, docs/train.md).
"""
