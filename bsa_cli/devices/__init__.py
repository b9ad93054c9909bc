"""The device side: what runs the cases and how each run is recorded.

`create` chooses and checks the device (a `Device`: the reference device, an external binary or --cmd
template, torch_npu); `run_cases` runs cases on it over device ids, as `RunOptions` say, and writes each
case's run.json.

Modules: `base` (the `Device` protocol, outcomes, what every device shares), `config` (`create`,
`RunOptions`, --devices), `binary`, `torch_npu`, `reference` (the built-in reference device, `bsa emulate`)
with `faults` (its planted faults), `process` (child processes), `repeat` (--repeat), `record` (run.json),
`run` (`run_cases`), `software` (run.json's `device_software`).
"""

# The package's names, re-exported for its callers.
from .base import OUTCOMES, Device, DeviceKind, Outcome, RunConfigError  # noqa: F401
from .config import DEVICE_KINDS, RunOptions, create, parse_device_ids, reference_faults  # noqa: F401
from .run import RunEvent, RunResult, RunSummary, output_dir_for, run_case, run_cases  # noqa: F401
