"""The two twins: plain and recompute models from one ``state_dict`` (:mod:`.setup`), the recompute
wrapping (:mod:`.recompute`), a twin's state after a step (:mod:`.snapshot`) and the task contract probe
(:mod:`.contract`)."""
