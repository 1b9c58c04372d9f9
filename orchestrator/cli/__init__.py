"""Stage 10: the command line. Parses, runs one command, maps what it raised to an exit code."""
