"""The GPU's SM clock, power and clock-event reasons, sampled by nvidia-smi while a run goes on, and
what they say about it: the clock the run had, and how often the power cap held it down.

Why: at batch 256 bin/train runs an H200 into its 700 W software power cap, and the SM clock falls
from 1,980 MHz to 1,733-1,890 on average where PyTorch's rung runs at 1,980 throughout
(bench/results/levers-session39-nvidia-h200-2026-12-01.md). A step made faster by fewer bytes can
also be one that draws less power; an A-B that reports the clocks tells the two apart.

Only the samples with the GPU at least BUSY_PERCENT busy count: the run's start-up (data, cuDNN's
plans) is not its steady state.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one
    print(f"{sys.argv[0]} is a module (how bench/ab.py --clocks reads the GPU's clocks), not a program: "
          "run python3 bench/ab.py --clocks", file=sys.stderr)
    sys.exit(2)

import statistics  # noqa: E402
import subprocess  # noqa: E402
from dataclasses import dataclass  # noqa: E402

QUERY = "clocks.sm,power.draw.instant,clocks_throttle_reasons.active,utilization.gpu"
PERIOD_MS = 100
SW_POWER_CAP = 0x4  # nvidia-smi's clock-event reason bit for the software power cap
BUSY_PERCENT = 90


@dataclass
class Sample:
    sm_mhz: int
    power_w: float
    reasons: int      # clock-event reasons, a bit mask
    utilization: int  # percent of the sample period the GPU ran a kernel


@dataclass
class ClockSummary:
    busy_samples: int
    sm_mhz: float         # median over the busy samples
    capped_share: float   # of the busy samples, those with the power cap's bit set
    power_w: float        # median instantaneous power over the busy samples


def query_command(gpu: str, period_ms: int | None = None) -> list[str]:
    """nvidia-smi's command for QUERY on `gpu` (an index or UUID): one line, or one every period_ms."""
    cmd = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-i", gpu]
    return cmd + (["-lms", str(period_ms)] if period_ms else [])


def parse_sample(line: str) -> Sample | None:
    """One line of query_command's output ("1890, 710.39, 0x0000000000000004, 100"); None for
    anything else (a field nvidia-smi reports as [N/A], an error line)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        return Sample(int(parts[0]), float(parts[1]), int(parts[2], 16), int(parts[3]))
    except ValueError:
        return None


def summarize(samples: list[Sample]) -> ClockSummary | None:
    """The busy samples' clock, power-capped share and power; None where no sample was busy."""
    busy = [s for s in samples if s.utilization >= BUSY_PERCENT]
    if not busy:
        return None
    return ClockSummary(len(busy), statistics.median(s.sm_mhz for s in busy),
                        sum(1 for s in busy if s.reasons & SW_POWER_CAP) / len(busy),
                        statistics.median(s.power_w for s in busy))


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


class ClockSampler:
    """nvidia-smi sampling `gpu` every PERIOD_MS from start() to stop(), which returns the samples."""

    def __init__(self, gpu: str):
        self.gpu = gpu
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(query_command(self.gpu, PERIOD_MS), stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> list[Sample]:
        proc, self._proc = self._proc, None
        if proc is None:
            return []
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        return [s for s in map(parse_sample, out.splitlines()) if s is not None]
