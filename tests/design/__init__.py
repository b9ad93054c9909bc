"""The shape of the code and of the tests: imports flow one way, no test file imports another."""
