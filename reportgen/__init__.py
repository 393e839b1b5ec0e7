"""reportgen: prove an activation-recomputation claim with a signed HTML/PDF report."""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: Module names of earlier releases that users' configs may still name in ``_target_`` (and
#: ``recompute.enable``), mapped to where the code lives now (docs/architecture.md).
LEGACY_MODULES = {
    "reportgen.hf": "reportgen.models.hf",
    "reportgen.hf_auto": "reportgen.models.hf.auto",
    "reportgen.hf_masked": "reportgen.models.hf.masked",
}


class _LegacyNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that holds its code now (same module object)."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (importlib protocol)
        if fullname not in LEGACY_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: D102
        return importlib.import_module(LEGACY_MODULES[spec.name])

    def exec_module(self, module):  # noqa: D102 (already executed under its new name)
        return None


if not any(isinstance(finder, _LegacyNames) for finder in sys.meta_path):
    sys.meta_path.append(_LegacyNames())
