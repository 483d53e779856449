"""The GPU's SM clock, power and clock-event reasons, sampled by nvidia-smi while a run goes on, and
what they say about it: the clock the run had, and how often the power cap held it down.

Why: at batch 256 bin/train runs an H200 into its 700 W software power cap, and the SM clock falls
from 1,980 MHz to 1,733-1,890 on average where PyTorch's rung runs at 1,980 throughout
(bench/results/levers-session39-nvidia-h200-2026-12-01.md). A step made faster by fewer bytes can
also be one that draws less power; an A-B that reports the clocks tells the two apart.

Only the samples with the GPU at least BUSY_PERCENT busy count, and, where the run reports its timed
window's wall-clock bounds (window_start_unix_ms and window_end_unix_ms in its summary line: bin/train
and bench/pytorch_reference.py do), only those inside it: the run's start-up (data, cuDNN's plans,
torch.compile's autotuning) is not its steady state.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one
    print(f"{sys.argv[0]} is a module (how bench/ab.py and bench/bench.py read the GPU's clocks with --clocks), "
          "not a program: run python3 bench/ab.py --clocks", file=sys.stderr)
    sys.exit(2)

import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime  # noqa: E402
from typing import Callable, TypeVar  # noqa: E402

from .runner import die  # noqa: E402

QUERY = "timestamp,clocks.sm,power.draw.instant,clocks_throttle_reasons.active,utilization.gpu"
TIMESTAMP = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's, in the host's local time
PERIOD_MS = 100
SW_POWER_CAP = 0x4  # nvidia-smi's clock-event reason bit for the software power cap
BUSY_PERCENT = 90
T = TypeVar("T")


@dataclass
class Sample:
    unix: float       # when, in seconds since the Unix epoch
    sm_mhz: int
    power_w: float
    reasons: int      # clock-event reasons, a bit mask
    utilization: int  # percent of the sample period the GPU ran a kernel


@dataclass
class ClockSummary:
    busy_samples: int     # the samples counted: at least summarize()'s min_busy percent busy
    sm_mhz: float         # median over the busy samples
    capped_share: float   # of the busy samples, those with the power cap's bit set
    power_w: float        # median instantaneous power over the busy samples


def query_command(gpu: str, period_ms: int | None = None) -> list[str]:
    """nvidia-smi's command for QUERY on `gpu` (an index or UUID): one line, or one every period_ms."""
    cmd = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-i", gpu]
    return cmd + (["-lms", str(period_ms)] if period_ms else [])


def parse_sample(line: str) -> Sample | None:
    """One line of query_command's output ("2026/12/01 05:25:13.494, 1890, 710.39, 0x0000000000000004,
    100"); None for anything else (a field nvidia-smi reports as [N/A], an error line)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        return Sample(datetime.strptime(parts[0], TIMESTAMP).timestamp(), int(parts[1]), float(parts[2]),
                      int(parts[3], 16), int(parts[4]))
    except ValueError:
        return None


def window_of(summary: dict) -> tuple[float, float] | None:
    """A run's timed window on the wall clock, in seconds, from its summary line; None where it has none."""
    start, end = summary.get("window_start_unix_ms"), summary.get("window_end_unix_ms")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)) or not 0 < start <= end:
        return None
    return start / 1000.0, end / 1000.0


def summarize(samples: list[Sample], window: tuple[float, float] | None = None,
              min_busy: int = BUSY_PERCENT) -> ClockSummary | None:
    """The busy samples' clock, power-capped share and power (within `window`, seconds since the epoch,
    where given); None where no sample was busy. min_busy 0 counts every sample (bench/power_model.py:
    its idle phase is the point)."""
    busy = [s for s in samples if s.utilization >= min_busy and (window is None or window[0] <= s.unix <= window[1])]
    if not busy:
        return None
    return ClockSummary(len(busy), statistics.median(s.sm_mhz for s in busy),
                        sum(1 for s in busy if s.reasons & SW_POWER_CAP) / len(busy),
                        statistics.median(s.power_w for s in busy))


def mj_per_image(summary: ClockSummary, images_per_s: float | None) -> float | None:
    """A run's energy an image: its power over its images/s (W / (images/s) = J an image), in mJ."""
    return 1000.0 * summary.power_w / images_per_s if images_per_s else None


def visible_gpu() -> str:
    """The GPU a run uses, as nvidia-smi -i takes it: CUDA_VISIBLE_DEVICES's first, else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


def check_readable(gpu: str) -> str:
    """"" where nvidia-smi reports QUERY for `gpu`, else why not (one line)."""
    try:
        out = subprocess.run(query_command(gpu), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi did not run: {e}"
    first = (out.stdout.strip().splitlines() or [out.stderr.strip()] or [""])[0]
    if out.returncode != 0 or parse_sample(first) is None:
        return f"nvidia-smi cannot report {QUERY} for GPU {gpu}: {first or 'no output'}"
    return ""


def sampler_for_visible_gpu(tool: str, asked_by: str = "--clocks") -> "ClockSampler":
    """The sampler of a tool's runs (asked for by its flag `asked_by`, or "" where the tool always
    samples), for the GPU they use; where nvidia-smi cannot report QUERY for it, one line and exit 2,
    before any run."""
    gpu = visible_gpu()
    why = check_readable(gpu)
    if why:
        die(tool, f"{asked_by}: {why}" if asked_by else why)
    return ClockSampler(gpu)


class ClockSampler:
    """nvidia-smi sampling `gpu` every PERIOD_MS from start() to stop(), which returns the samples. The
    samples go to a file, not a pipe: a run of minutes (torch.compile's) fills a pipe nobody reads, and
    nvidia-smi would then block and take no more samples."""

    def __init__(self, gpu: str):
        self.gpu = gpu
        self._proc: subprocess.Popen | None = None
        self._out = None

    def around(self, run: Callable[[], T]) -> tuple[T, list[Sample]]:
        """run()'s result, and the samples taken while it ran (also when it raised: none are kept)."""
        self.start()
        try:
            result = run()
        finally:
            samples = self.stop()
        return result, samples

    def start(self) -> None:
        self._out = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(query_command(self.gpu, PERIOD_MS), stdout=self._out,
                                      stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> list[Sample]:
        proc, out, self._proc, self._out = self._proc, self._out, None, None
        if proc is None:
            return []
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with out:
            out.seek(0)
            return [s for s in map(parse_sample, out.read().splitlines()) if s is not None]
