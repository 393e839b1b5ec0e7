"""Trust: what binds a signed document to what it was made from (a sweep to its launch, a run to
the files it wrote, a finished run to its late signature)."""
