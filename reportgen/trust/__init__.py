"""Trust: signing keys (:mod:`.keys`), user-source provenance (:mod:`.sources`), the in-toto/DSSE
statement and PAdES signatures (:mod:`.signing`) and PDF attachments (:mod:`.attachments`)., and what binds a
signed document to what it was made from: a sweep to its launch (:mod:`.launch`, :mod:`.jobs`)."""
