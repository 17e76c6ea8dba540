"""Ops: nn (being written)."""
