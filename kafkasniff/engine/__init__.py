"""Running a decode: worker processes that share out a capture's connections (parallel.py)."""
