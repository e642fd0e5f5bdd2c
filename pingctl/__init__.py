"""pingctl: a generative Transformer over internet latency measurements."""

__version__ = "0.1.0"
