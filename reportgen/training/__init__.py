"""Training a twin: to an accepted-example budget (:mod:`.train`), the plain runs' disk cache
(:mod:`.cache`) and the duration estimate that refuses over-long settings (:mod:`.duration`)."""
