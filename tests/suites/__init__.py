"""The suites of cases/ end to end: edge against oracles, upstream on the devices, same bytes across NumPy."""
