"""Judging (bsa_cli/compare/, drift.py): metrics, standards, bias check, headlines, diagnosis, drift."""
