"""Trust: signing keys (:mod:`.keys`), user-source provenance (:mod:`.sources`), the in-toto/DSSE
statement and PAdES signatures (:mod:`.signing`) and PDF attachments (:mod:`.attachments`)."""
