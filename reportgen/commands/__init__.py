"""Every command, the top layer (docs/architecture.md "Folders and layers"): the Hydra app and its exit
codes (:mod:`.cli`), the pipeline (:mod:`.run`), a plan's recompute file judged at the run's shape
(:mod:`.planned`), signing a finished run later (:mod:`.sign`), the compare command (:mod:`.compare`),
the planner's command (:mod:`.plan`); the guards around a command-line run: unknown settings
(:mod:`.overrides`), value validation (:mod:`.validation`) and the run folder's refusal and lock
(:mod:`.rundir`); the configuration reference (:mod:`.reference`). The ``python -m`` entry points
(``reportgen/__main__.py``, ``sign.py``, ``keys.py``, each package's ``__main__.py``) only import from
here or from the module that defines their command."""
