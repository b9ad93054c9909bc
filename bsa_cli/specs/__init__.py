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

from .fields import CASE_KEYS as CASE_KEYS
from .fields import dtype_name as dtype_name
from .load import MAX_CASES as MAX_CASES
from .load import SpecErrors as SpecErrors
from .load import build_alone as build_alone
from .load import load_specs as load_specs
from .safe_yaml import read_yaml as read_yaml
