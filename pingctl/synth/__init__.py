"""`pingctl synth`: a synthetic, RIPE-Atlas-like ping world with ground truth.

- `world`: hosts in real cities, ASes and prefixes, streams and their path parameters
- `model`: the RTT formulas shared by the generator and the truth
- `generate`: chunked, vectorized generation to Parquet (`generate(cfg, out)`)
- `truth`: the truth sidecar and `truth_median_ms`
- `bench`: `bench_synth` for `pingctl bench synth`

See docs/synth.md. Nothing heavy is imported here, so `pingctl --help` stays fast.
"""
