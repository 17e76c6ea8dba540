"""Ops: shape (being written)."""
