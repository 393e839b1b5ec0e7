"""The report: what page 1 leads with (evidence), and, after the restructure, rendering and its guard."""
