"""The report: HTML/PDF rendering (:mod:`.render`), guards for missing values (:mod:`.guard`), the
local-only fetcher, run metadata, the diagnosis of failing checks and page 1's evidence (:mod:`.evidence`)."""
