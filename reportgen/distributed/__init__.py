"""Sharded runs: launching ranks and sharding a twin (:mod:`.launch`), running a check's parts on every
rank (:mod:`.ranks`) and task metrics at a global budget (:mod:`.budget`)."""
