"""The warm-step time check: ``check.py`` (its ``CHECK`` and the interleaved timing), ``rows.py`` (median,
overhead, CI width, FLOP bound and machine-load rows), ``plots.py``."""
