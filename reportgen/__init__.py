"""reportgen: prove an activation-recomputation claim with a signed HTML/PDF report."""

__version__ = "0.1.0"
