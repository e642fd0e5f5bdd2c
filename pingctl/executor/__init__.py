"""Where work runs: one `Executor` interface (`base`), one home per engine (`local`; `slurm` and
`modal`, subpackages holding everything each engine knows, training included), the `registry`
every `--target` reads, and the one fan-out driver of `ingest` and `build-rows` (`fanout`: plan,
tasks, completion, merge, resume of the failed tasks only). docs/architecture.md, "Adding an
engine"."""
