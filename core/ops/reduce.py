"""Ops: reduce (being written)."""
