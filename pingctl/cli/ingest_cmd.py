"""`pingctl ingest` (being written)."""


def register(app) -> None:
    pass
