"""Comparing two signed runs: the derivation (:mod:`.derive`, read by the verifier) and the
``python -m reportgen.compare`` command (:mod:`.command`)."""
