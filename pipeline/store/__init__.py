"""A run's files: where each lives, atomic writes, ``run.json``, checks before trust, reading
results back.
"""
