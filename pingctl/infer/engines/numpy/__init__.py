"""The NumPy engine (`--engine numpy`): `net` (the decoder in NumPy alone), `kv` (its key-value
cache), `engine` (its entry in the table)."""
