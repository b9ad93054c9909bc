"""The leaves every layer stands on: errors, the frozen `Case` and its geometry, layouts, rounding, random
streams, BLAS threads, worker processes, and bounded reading of untrusted files. Imports nothing of bsa
above it."""
