"""Stand-ins for what the GPU machine has: nvidia-smi, nsys and the trainer binaries.

Each is a small executable script written into a temporary folder that the test puts first (or
alone) on PATH. The fake trainer replays recorded runs from tests/fixtures/bench/, the fake nsys
runs the fake trainer and copies the recorded CSVs from tests/fixtures/nsys/ where `nsys stats`
would write them. Every command line is appended to calls.log, so tests can check what was run.
"""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from tests.python import BENCH, FIXTURES

FAKE_TRAINER = r'''
import shutil, sys
from pathlib import Path
FIXTURES, VARIANT, LOG = Path({fixtures!r}), {variant!r}, Path({log!r})
args = sys.argv[1:]
with LOG.open("a") as log:
    log.write(" ".join([VARIANT] + args) + "\n")
if {no_device!r}:
    print("error: no CUDA device found: cudaGetDeviceCount returned 100 (no CUDA-capable device is detected)", file=sys.stderr)
    sys.exit(1)
if "--trace" in args:
    shutil.copy(FIXTURES / "train-baseline.trace.json", args[args.index("--trace") + 1])
    name = VARIANT + ".trace"
else:  # runs 1, 2, 3 of this variant replay run1, run2, run3 (a variant with one recording repeats it)
    counter = LOG.with_name(VARIANT + ".count")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    name = f"{{VARIANT}}.run{{n}}"
    if not (FIXTURES / f"{{name}}.jsonl").exists():
        name = f"{{VARIANT}}.run1"
stdout = FIXTURES / f"{{name}}.jsonl"
stderr = FIXTURES / f"{{name}}.stderr"
if stdout.exists():
    sys.stdout.write(stdout.read_text())
if stderr.exists():
    sys.stderr.write(stderr.read_text())
    sys.exit(1)
'''

FAKE_NSYS = r'''
import shutil, subprocess, sys
from pathlib import Path
NSYS_FIXTURES, LOG = Path({nsys_fixtures!r}), Path({log!r})
args = sys.argv[1:]
with LOG.open("a") as log:
    log.write(" ".join(["nsys"] + args) + "\n")
if args[0] == "profile":
    for needed in ("--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"):
        if needed not in args:
            sys.exit("fake nsys: missing " + needed)
    out = args[args.index("-o") + 1]
    Path(out + ".nsys-rep").write_text("fake report")
    sys.exit(subprocess.run(args[args.index("-o") + 2:]).returncode)
if args[0] == "stats":
    if args[args.index("--report") + 1] != "nvtx_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum,cuda_gpu_trace":
        sys.exit("fake nsys: unexpected reports")
    if args[args.index("--format") + 1] != "csv" or not args[-1].endswith(".nsys-rep"):
        sys.exit("fake nsys: expected --format csv and a .nsys-rep")
    prefix = Path(args[args.index("--output") + 1])
    for recorded in NSYS_FIXTURES.glob(prefix.name + "_*.csv"):
        shutil.copy(recorded, str(prefix) + recorded.name[len(prefix.name):])
    sys.exit(0)
sys.exit("fake nsys: unknown command")
'''


def popen_interruptible(cmd: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen with SIGINT as a terminal leaves it, for the tests that Ctrl-C a tool. A test
    run from a background job (CI's, `make test &`) inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: the tool would run on as if it had not been sent."""
    return subprocess.Popen(cmd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class FakeMachine:
    """A temporary GPU machine: tools on a private PATH, binaries in bin_dir."""

    def __init__(self, root: Path, gpu: bool = True, nsys: bool = False):
        self.root = root
        self.tools = root / "tools"
        self.bin_dir = root / "bin"
        self.log = root / "calls.log"
        self.tools.mkdir()
        self.bin_dir.mkdir()
        if gpu:
            _write_executable(self.tools / "nvidia-smi",
                              "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)'\n")
        if nsys:
            _write_executable(self.tools / "nsys", f"#!{sys.executable}\n" + FAKE_NSYS.format(
                nsys_fixtures=str(FIXTURES / "nsys"), log=str(self.log)))

    def add_binary(self, variant: str, no_device: bool = False) -> None:
        _write_executable(self.bin_dir / variant, f"#!{sys.executable}\n" + FAKE_TRAINER.format(
            fixtures=str(FIXTURES / "bench"), variant=variant, log=str(self.log), no_device=no_device))

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def run_script(self, script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Runs bench/<script> with only the fake tools on PATH (no real nvidia-smi or nsys)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PATH", "PYTHONPATH")}
        env["PATH"] = str(self.tools)
        return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=self.root)
