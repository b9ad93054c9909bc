"""The golden (bsa_cli/golden/) against oracles, against the frozen module of 2b40f9e, against committed vectors."""
