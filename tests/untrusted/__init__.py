"""Untrusted input: hostile specs, case folders and binaries end in one line and a documented exit code."""
