"""Comparing two signed runs: the derivation (:mod:`.derive`), read by the verifier and by the
``python -m reportgen.compare`` command (:mod:`reportgen.commands.compare`)."""
