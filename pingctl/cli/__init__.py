"""Thin CLI layer: parse options, call the library, print. No computation here."""
