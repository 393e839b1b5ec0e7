"""Guards around a command-line run: value validation (:mod:`.validation`) and the run folder's
refusal and lock (:mod:`.rundir`)."""
