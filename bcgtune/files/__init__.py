"""Artifacts on disk: reading and writing the files bcgtune takes and makes."""
