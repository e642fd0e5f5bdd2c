"""`pingctl synth` (being written)."""


def register(app) -> None:
    pass
