"""Memory: saved-activation bytes and recompute observation (:mod:`.saved`), the peak of live tensor
bytes of a warm step (:mod:`.peak`) and the FakeTensor estimate (:mod:`.estimate`)."""
