"""One module per checklist item; each check is ``fn(setup) -> list[Row]``."""
