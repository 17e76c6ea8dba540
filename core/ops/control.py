"""Ops: control flow and resource variables (being written)."""
