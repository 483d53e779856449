"""What the bench scripts need from the machine: a GPU, the binaries, and a way to run them.

bench.py, profile.py and profile_check.py all start the same way (is there a GPU? are the binaries
built?) and run binaries the same way (capture everything, never raise on a failing binary), so that
lives here. The table and profile parsers stay free of subprocess calls so they can be unit-tested.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (what the bench tools share), not a program: "
          "run one of them, e.g. python3 bench/bench.py (make bench)", file=sys.stderr)
    sys.exit(2)

import argparse
import datetime
import errno
import glob
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = REPO_ROOT / "bin"

# The optimization ladder, cumulative, in the order `make variants` builds it.
LADDER = ["train-baseline", "train-devloss", "train-pinned", "train-autotune", "train-fp16", "train-nhwc",
          "train-graph", "train-fusedbn", "train-cudagraph", "train-wgradstream"]
# bin/predict's egress ladder, cumulative, in the order `make predict-variants` builds it.
PREDICT_LADDER = ["predict-baseline", "predict-workers", "predict-pool", "predict-async", "predict-stream"]
LADDERS = {"train": LADDER, "predict": PREDICT_LADDER}
# The binaries `make` builds beside each ladder: the program itself and the non-rungs (the Makefile's
# FIXED_VARIANTS). Any other bin/train-NAME is one of `make custom NAME=...`, known once it is built.
OTHER_BINARIES = {"train": ["train", "train-fp32-nhwc", "train-ddp-naive"], "predict": ["predict"]}
MAKE_TARGETS = {"train": "`make variants` (and `make` for bin/train)", "predict": "`make predict-variants`"}

NO_GPU_LINE = "no CUDA GPU on this machine; run it on the GPU machine"
DATA_SETS = ["auto", "cifar10", "fashion-mnist", "synthetic", "folder"]  # bin/train's --data


@dataclass
class RunOutput:
    """Everything one run of a binary left behind; returncode None means the timeout killed it."""
    returncode: int | None
    stdout: str
    stderr: str
    timeout_s: float | None = None


def die(tool: str, message: str, code: int = 2) -> NoReturn:
    """One line on stderr and a non-zero exit: what a user without a GPU or a build should see."""
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line (`<tool>: ...`, exit 2), like a tool's own checks
    (die), not argparse's usage block."""

    def __init__(self, tool: str, **kwargs):
        super().__init__(**kwargs)
        self.tool = tool

    def error(self, message: str) -> NoReturn:
        die(self.tool, f"{message} (see --help)")


def check_timeout(p: argparse.ArgumentParser, timeout: float) -> None:
    """--timeout as a usage error unless it is a finite, positive number of seconds: float() takes
    "nan" and "inf", and subprocess cannot wait inf seconds (OverflowError) nor -1 (every run "times out")."""
    if not (math.isfinite(timeout) and timeout > 0):
        p.error(f"--timeout must be a positive number of seconds, not {timeout:g}")


def parse_list(p: argparse.ArgumentParser, flag: str, spec: str, item: Callable[[str], object] = str,
               distinct: bool = False) -> list:
    """A comma list flag ("128,256"), each item through `item`; an empty item ("128,,256"), one that
    `item` refuses (ValueError) or, with distinct, a repeat is a usage error: a typo must not
    silently run fewer or more points than asked for."""
    values = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            p.error(f"{flag} {spec!r} has an empty item")
        try:
            value = item(part)
        except ValueError:
            p.error(f"{flag}: {part!r} is not a valid item")
        if distinct and value in values:
            p.error(f"{flag} {spec!r} names {part} twice")
        values.append(value)
    return values


def split_flags(p: argparse.ArgumentParser, flag: str, text: str) -> list[str]:
    """--extra's flags as the shell would split them; an unclosed quote is a usage error here, not a
    traceback after the other checks (or runs) went by."""
    try:
        return shlex.split(text)
    except ValueError as e:
        p.error(f"{flag} {text!r}: {e}")


def takes_files(directory: Path) -> bool:
    """Whether a file can be made in directory: a real try (deleted at once), since os.access says yes
    to root for /proc and to read-only mounts."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def prepare_out_dir(tool: str, out: Path, flag: str = "--out") -> None:
    """Checks before any run that an output directory could take files, so that a bad path costs no
    run (exit 2, one line). It creates nothing: a run that writes nothing leaves no empty directory."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == out and not out.is_dir():
        die(tool, f"{flag} {out}: not a directory")
    if existing == out and not takes_files(out):
        die(tool, f"{flag} {out}: the directory is not writable")
    if existing != out and not existing.is_dir():
        die(tool, f"{flag} {out}: cannot create the directory: {os.strerror(errno.ENOTDIR)}")
    if existing != out and not takes_files(existing):
        die(tool, f"{flag} {out}: cannot create the directory: {os.strerror(errno.EACCES)}")


def write_files(tool: str, files: dict[Path, str]) -> None:
    """Writes the results, making their directory; a failure after the runs (disk full, directory
    gone) is one line and exit 1."""
    for path, text in files.items():
        try:
            if not path.parent.exists():  # (a file there fails the write below: "Not a directory")
                path.parent.mkdir(parents=True)
            path.write_text(text)
        except OSError as e:
            die(tool, f"cannot write {path}: {e.strerror}", 1)


def stop_if_all_failed(tool: str, rows: list) -> None:
    """A table of failures (table.Row's) is no result: nothing is written, so that it cannot overwrite
    a good one of the same name, and the exit status says so."""
    if all(row.failed for row in rows):
        last = next((row.failures[-1] for row in reversed(rows) if row.failures), "no run")
        die(tool, f"every run failed (the last: {last}); no results written", code=1)


def main_entry(tool: str, main: Callable[[], int]) -> NoReturn:
    """What each tool's `if __name__ == "__main__":` calls: Ctrl-C is one line and exit 130 (the shell's
    128 + SIGINT), not a traceback. Children started with subprocess.run are killed by run() itself as
    the interrupt unwinds; the tools that Popen their own kill them in a finally."""
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


def gpu_names() -> list[str]:
    """The GPUs `nvidia-smi -L` lists ("NVIDIA H100 80GB HBM3"); empty without nvidia-smi or a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    names = []
    for line in out.stdout.splitlines():
        m = re.match(r"GPU \d+: (.*?)(?: \(UUID: .*\))?$", line.strip())
        if m:
            names.append(m.group(1))
    return names


def variant_name(name: str, program: str = "train") -> str:
    """Accepts "baseline", "train-baseline" or "train" and returns the binary's name (the same with
    "predict" for bin/predict's ladder)."""
    if name == program or name.startswith(program + "-"):
        return name
    return f"{program}-{name}"


def parse_variants(p: argparse.ArgumentParser, spec: str, program: str = "train", with_all: bool = True) -> list[str]:
    """--variants as the binaries' names, for a tool to parse once: a comma list of names ("baseline"
    or "train-baseline"; program's own name for bin/<program>), and with_all, "all" for the ladder
    ("all,train" adds bin/train). An empty item, a binary named twice ("all,baseline" too) or a list
    that names nothing is a usage error: a typo must not silently run fewer binaries than asked for."""
    if not spec.replace(",", "").strip():
        hint = f"ladder names, 'all' or {program!r}" if with_all else "binary names"
        p.error(f"--variants {spec!r} selects no variant ({hint})")
    parts = parse_list(p, "--variants", spec)
    ladder = with_all and "all" in parts
    names: list[str] = []
    for part in parts:
        for name in LADDERS[program] if ladder and part == "all" else [variant_name(part, program)]:
            if name in names:
                p.error(f"--variants {spec!r} names {name} twice" + (" ('all' is the whole ladder)" if ladder else ""))
            names.append(name)
    return names


def check_known(p: argparse.ArgumentParser, flag: str, names: list[str], bin_dir: Path, program: str = "train") -> None:
    """A usage error for a name that is no binary `make` builds (the ladder, the program, the non-rungs)
    nor one built in bin_dir (make custom's): before the GPU is looked for, so that a typo is not
    answered with "no GPU"."""
    known = LADDERS[program] + OTHER_BINARIES[program]
    for name in names:
        if name not in known and not (bin_dir / name).is_file():
            rungs = ", ".join(n.removeprefix(program + "-") for n in LADDERS[program])
            custom = f", or a {bin_dir}/{program}-NAME that `make custom NAME=...` built" if program == "train" else ""
            p.error(f"{flag}: no binary {name!r}: the ladder is {rungs} ('all'), "
                    f"besides {', '.join(OTHER_BINARIES[program])}{custom}")


def check_at_least(p: argparse.ArgumentParser, args: argparse.Namespace, **minimum: int) -> None:
    """A usage error for each count below its minimum (check_at_least(p, args, batch=1, warmup_steps=0))."""
    for name, low in minimum.items():
        value = getattr(args, name)
        if value < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}, not {value}")


def find_binaries(variants: list[str], bin_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """Paths of the variants' binaries, and the names of those that are not built."""
    found, missing = {}, []
    for v in variants:
        path = bin_dir / v
        if path.is_file() and path.stat().st_mode & 0o111:
            found[v] = path
        else:
            missing.append(v)
    return found, missing


def missing_binaries_line(missing: list[str], bin_dir: Path, program: str = "train") -> str:
    shown = ", ".join(str(bin_dir / m) for m in missing)
    return f"{shown} not built: run {MAKE_TARGETS[program]} first"


def require_gpu_and_binaries(tool: str, variants: list[str], bin_dir: Path, program: str = "train"
                             ) -> tuple[list[str], dict[str, Path]]:
    """How every bench script starts: the GPUs, and the binaries of the variants (parse_variants) asked
    for; one line and exit 2 when there is no GPU or a binary is not built."""
    gpus = gpu_names()
    if not gpus:
        die(tool, NO_GPU_LINE)
    binaries, missing = find_binaries(variants, bin_dir)
    if missing:
        die(tool, missing_binaries_line(missing, bin_dir, program))
    return gpus, binaries


def run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> RunOutput:
    """Runs a binary to completion, capturing everything; a failure is data, never an exception. env:
    variables set for this run on top of this process's environment."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                             env={**os.environ, **env} if env else None)
        return RunOutput(out.returncode, out.stdout, out.stderr, timeout_s)
    except subprocess.TimeoutExpired as e:
        return RunOutput(None, _text(e.stdout), _text(e.stderr), timeout_s)
    except OSError as e:
        return RunOutput(127, "", f"error: cannot run {cmd[0]}: {e.strerror}", timeout_s)


class GuardedRunner:
    """runner.run, except that when the very first run says CUDA has no device, the tool stops with
    one line: a table or profile of identical "no CUDA device" failures helps nobody."""

    def __init__(self, tool: str):
        self.tool = tool
        self.first = True

    def run(self, cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> RunOutput:
        out = run(cmd, timeout_s, env)
        if self.first and reports_no_cuda_device(out):
            die(self.tool, f"{NO_GPU_LINE} ({last_line(out.stderr)})")
        self.first = False
        return out


def make_predict_checkpoint(tool: str, bin_dir: Path, out_dir: Path, guard: GuardedRunner, timeout_s: float) -> Path:
    """A checkpoint for bin/predict to load, from one step of bin/train on synthetic data (speed does
    not depend on the weights). Stops the tool with one line when bin/train is missing or fails."""
    train = bin_dir / "train"
    if not (train.is_file() and train.stat().st_mode & 0o111):
        die(tool, f"{train} not built: run `make` first (bin/predict needs a checkpoint of it)")
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "predict-bench.ckpt"
    out = guard.run([str(train), "--data", "synthetic", "--synthetic-size", "64", "--batch", "32", "--steps", "1",
                     "--epochs", "1", "--no-eval", "--deterministic", "--save", str(ckpt)], timeout_s)
    if out.returncode != 0 or not ckpt.is_file():
        die(tool, f"bin/train could not make the checkpoint to predict with: "
                  f"{last_line(out.stderr) or f'exit code {out.returncode}'}")
    return ckpt


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def reports_no_cuda_device(out: RunOutput) -> bool:
    """The trainer's own words when CUDA finds no device (exit 1, "error: no CUDA device found: ...")."""
    return out.returncode not in (0, None) and "no cuda device" in out.stderr.lower()


# Where installs outside PATH put nsys: NVIDIA's packages under /opt/nvidia/nsight-systems[-cli]/<version>,
# the CUDA toolkit under /usr/local/cuda-<version>/nsight-systems-<version>. Fixed depths on purpose:
# a recursive search of a CUDA tree (symlinks and all) takes minutes.
NSYS_PATTERNS = ["/opt/nvidia/nsight-systems*/bin/nsys", "/opt/nvidia/nsight-systems*/*/bin/nsys",
                 "/opt/nvidia/nsight-systems*/*/target-linux-*/nsys", "/usr/local/cuda*/bin/nsys",
                 "/usr/local/cuda*/nsight-systems*/bin/nsys"]


def find_nsys() -> Path | None:
    """nsys on PATH, else the newest install in the usual places (a bin/nsys launcher first)."""
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    found = [Path(p) for pattern in NSYS_PATTERNS for p in glob.glob(pattern)]
    runnable = [p for p in found if p.is_file() and os.access(p, os.X_OK)]
    launchers = [p for p in runnable if p.parent.name == "bin"]
    pick = sorted(launchers or runnable)
    return pick[-1] if pick else None


def slug(text: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3", for file names."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown-gpu"


def today() -> str:
    return datetime.date.today().isoformat()


def last_line(text: str) -> str:
    """The last non-empty line: where a failing binary puts its "error: ..." message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
