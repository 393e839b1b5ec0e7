"""The report: HTML/PDF rendering (:mod:`.render`), guards for missing values (:mod:`.guard`), the
local-only fetcher, run metadata and the diagnosis of failing checks."""
