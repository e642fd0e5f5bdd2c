"""The MaxText engine (`--engine maxtext`): `engine` (MaxText's model and Orbax restore, its entry
in the table), `kv` (MaxText's key-value cache), `weights` (an nnx state's weights by name, a
model built for an export), `config` (the MaxText config they build)."""
