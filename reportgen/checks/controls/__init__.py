"""The detector controls: ``check.py`` holds the ``CHECK``; ``faults.py`` the hooks that inject and observe the
region, ``fixed_batch.py`` and ``later.py`` the six controls, ``rows.py`` their rows and why a check was blind."""
