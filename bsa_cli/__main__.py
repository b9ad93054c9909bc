"""`python -m bsa_cli`: the same as the `bsa` command."""

from .cli import main

main()
