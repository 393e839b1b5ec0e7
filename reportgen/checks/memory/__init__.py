"""The warm-step memory check: ``check.py`` (its ``CHECK`` and the measurements), ``rows.py`` (saved
activations and step peak rows), ``estimate.py`` (the GPU-free estimate's rows), ``plots.py``."""
