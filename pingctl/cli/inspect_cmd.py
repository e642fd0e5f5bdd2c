"""`pingctl inspect` (being written)."""


def register(app) -> None:
    pass
