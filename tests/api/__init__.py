"""The Python API (api.py) and the pytest plugin (pytest_plugin.py)."""
