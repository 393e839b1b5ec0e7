"""The detector controls (issue 35): faults injected inside a recompute region while it recomputes, each of
which the check that exists for it must catch. ``check.py`` holds the ``CHECK``; ``faults.py`` the hooks that
inject, ``region.py`` what is observed of the region, ``rows.py`` the rows and why a check was blind."""
