"""The parity checks (gradient, optimizer-step and state, trajectory), each with its judge, below the checks that
call those judges (the detector controls, the sharded checks)."""
