#!/usr/bin/env python3
"""A fake device binary for bsa's runner tests: follows (or breaks) the binary contract on purpose.

Usage: fake_device.py [--tag TEXT] CASE_JSON OUTPUT_DIR

What it does depends on a word in the case's name:
    crash      writes half of dq.bin, then kills itself with SIGSEGV
    hang       starts a child (pid in OUTPUT_DIR/child.pid) and both sleep forever
    truncated  writes status 0 and a dq.bin one byte short
    nothing    exits 0 and writes nothing
    exitcode   writes status 0 and the outputs, then exits 3
    random     writes random outputs (differs on every run)
    badstatus  writes "oops" as the status
    otherwise  a correct device: the benchmark gradients when the case has them (zeros otherwise), and
               the expected status for negative cases (no gradient files then).
It prints its argv and the ASCEND_DEVICE_ID it sees on stdout.
"""

import json
import os
import signal
import subprocess
import sys
import time

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "uint8": 1, "int64": 8}


def nbytes(entry):
    count = 1
    for dim in entry["shape"]:
        count *= dim
    return count * ITEMSIZE[entry["dtype"]]


def main(argv):
    tag = None
    if argv[:1] == ["--tag"]:
        tag, argv = argv[1], argv[2:]
    manifest_path, output_dir = argv
    case_dir = os.path.dirname(os.path.abspath(manifest_path))
    with open(manifest_path) as f:
        manifest = json.load(f)
    print("argv", json.dumps(sys.argv[1:]))
    print("tag", tag)
    print("ASCEND_DEVICE_ID", os.environ.get("ASCEND_DEVICE_ID"))
    sys.stdout.flush()
    name = manifest["name"]
    outputs = manifest["outputs"]

    def write(name_, data):
        with open(os.path.join(output_dir, outputs[name_]["file"]), "wb") as f:
            f.write(data)

    def status(code, message=""):
        with open(os.path.join(output_dir, "status.txt"), "w") as f:
            f.write(f"{code}\n{message}\n" if message else f"{code}\n")

    if "crash" in name:
        write("dq", b"\0" * (nbytes(outputs["dq"]) // 2))
        os.kill(os.getpid(), signal.SIGSEGV)
    if "hang" in name:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        with open(os.path.join(output_dir, "child.pid"), "w") as f:
            f.write(str(child.pid))
        time.sleep(1000)
    if "nothing" in name:
        return 0
    if "badstatus" in name:
        with open(os.path.join(output_dir, "status.txt"), "w") as f:
            f.write("oops\n")
        return 0
    if "truncated" in name:
        status(0)
        for grad, entry in outputs.items():
            write(grad, b"\0" * (nbytes(entry) - (1 if grad == "dq" else 0)))
        return 0
    if "random" in name:
        status(0)
        for grad, entry in outputs.items():
            write(grad, os.urandom(nbytes(entry)))
        return 0
    expected = manifest["expect"]["status"]
    if expected != 0:
        status(expected, "fake device: expected error")
        return 0
    status(0, "fake device")
    for grad, entry in outputs.items():
        bench = manifest.get("benchmark", {}).get(grad)
        if bench:
            with open(os.path.join(case_dir, bench["file"]), "rb") as f:
                write(grad, f.read())
        else:
            write(grad, b"\0" * nbytes(entry))
    return 3 if "exitcode" in name else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
