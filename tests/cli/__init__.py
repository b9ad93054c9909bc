"""The commands (bsa_cli/cli/) through the CLI: gen, list, run, check, compare, export, options, the terminal."""
