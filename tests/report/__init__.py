"""Reports (bsa_cli/report/): terminal snapshots, JSON, JUnit, msprobe CSV, the HTML page and its screenshot."""
