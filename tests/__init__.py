"""bsa's tests, a package so that they import tests.helpers and tests.oracle under any --import-mode."""
