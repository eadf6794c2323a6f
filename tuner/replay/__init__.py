"""Replay: search strategies evaluated on recorded measurement tables, deterministic and fast.

- ``table.py``  — the table format (gzipped JSON lines: a header, then one row per config)
  and ``ReplaySpace``, the space whose valid points are exactly the recorded configs.
- ``record.py`` — records a table with the real measurement pipeline (``python -m
  tuner.replay.record``).
- ``runner.py`` — runs strategies against a table (no measuring, no timing) and computes
  trials-to-X%-of-best and the area under the best-so-far curve.
"""
