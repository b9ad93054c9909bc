"""The ops (bsa_cli/ops/): one `Op` per operator call, its name and its attributes."""
