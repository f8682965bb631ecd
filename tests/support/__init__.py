"""Test helpers importable from every tier (``tests`` is on pytest's pythonpath)."""
