"""User-side models for the tests: each reproduces one fault of ../shared/cases without
importing it (the tests must pass in a clone that has no ../shared)."""
