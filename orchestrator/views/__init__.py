"""Stage 9: views of a run directory, live or finished — `logs`, `status`, `stop`, `report`."""
