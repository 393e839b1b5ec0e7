"""The sharded checks: ``check.py`` (their ``CHECK`` and the parts every rank runs), ``grads.py`` (gradient
parity), ``steps.py`` (step and trajectory parity), ``cost.py`` (memory and time per rank)."""
