"""The engines that run a model's forward passes, behind one interface (`base.Engine`) and one
table (`registry`): `jax` (`--engine light`, the default), `numpy` (the same decoder without
JAX), `maxtext` (MaxText's own model: the reference); `arch` and `weights` are what the two
decoders of pingctl's own share. None imports another (.importlinter)."""
