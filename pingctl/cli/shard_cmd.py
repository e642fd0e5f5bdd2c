"""`pingctl shard` (being written)."""


def register(app) -> None:
    pass
