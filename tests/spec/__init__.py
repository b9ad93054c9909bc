"""Specs (bsa_cli/spec/): YAML into cases, defaults, matrices, errors, and the interface rules of interface.py."""
