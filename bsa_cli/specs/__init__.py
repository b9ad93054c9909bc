"""YAML case specs -> validated, frozen `Case` objects.

A spec file holds `cases:` (a list of mappings), optional `defaults:` merged into every case, and optional
`matrix:` (top level or per case) that expands a case over the cartesian product of listed values. Matrix
keys may be dotted (`sparsity.density`) to reach into a nested mapping.

Every error names the file, the case, the key and the bad value, and says what is allowed.

The modules, each importing only those before it: `safe_yaml` (bounded reading of an untrusted file:
`read_yaml`), `fields` (each key's checks, the key vocabularies), `expand` (defaults, matrix), `build` (one
expanded case -> `Case`: geometry, constraints, the interface rules, warnings), `load` (files and folders ->
the list of cases: `load_specs`).
"""

from .build import build_case
from .expand import deep_merge, expand_matrix
from .fields import CASE_KEYS, DTYPE_ALIASES, dtype_name
from .load import MAX_CASES, SpecErrors, load_spec_file, load_specs, raise_spec_errors, spec_files
from .safe_yaml import read_yaml

__all__ = [
    "CASE_KEYS",
    "DTYPE_ALIASES",
    "MAX_CASES",
    "SpecErrors",
    "build_case",
    "deep_merge",
    "dtype_name",
    "expand_matrix",
    "load_spec_file",
    "load_specs",
    "raise_spec_errors",
    "read_yaml",
    "spec_files",
]
