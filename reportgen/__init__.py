"""reportgen: prove an activation-recomputation claim with a signed HTML/PDF report."""

from reportgen.library_warnings import quiet_known_warnings

__version__ = "0.1.0"

quiet_known_warnings()  # every command: a dependency's warning the user cannot act on stays off the console
