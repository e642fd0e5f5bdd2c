"""`pingctl tokenize` (being written)."""


def register(app) -> None:
    pass
