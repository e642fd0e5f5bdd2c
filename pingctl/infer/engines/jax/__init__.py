"""The JAX engine (`--engine light`): `net` (the decoder in plain JAX), `kv` (its key-value
cache), `engine` (its entry in the table)."""
