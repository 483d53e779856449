"""Starting the ranks of a data-parallel run the way the launchers do, for the several-GPU bench tools
(scaling.py, profile_ranks.py).

Two transports:
  local    every rank on this machine as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK = RANK,
           MASTER_ADDR=127.0.0.1, MASTER_PORT); NCCL chooses NVLink, PCIe or shared memory between them.
  network  every rank plays a machine of its own: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES shows it one
           GPU, and NCCL is kept off peer-to-peer and shared memory (NCCL_P2P_DISABLE=1,
           NCCL_SHM_DISABLE=1) and off InfiniBand (NCCL_IB_DISABLE=1, unless set), so that the
           gradients cross its socket transport over the loopback interface (NCCL_SOCKET_IFNAME=lo):
           two machines on one host. NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD tune that transport.
NVLink multicast stays off in both (NCCL_NVLS_ENABLE=0, as the trainer sets it unless given).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (how bench/scaling.py and profile_ranks.py start ranks), not a program: "
          "run python3 bench/scaling.py (make bench-scaling)", file=sys.stderr)
    sys.exit(2)

import socket
import subprocess
from dataclasses import dataclass

from .runner import RunOutput, last_line

TRANSPORTS = ["local", "network"]

# What makes one host's GPUs talk as two machines do (the simulated machines).
NETWORK_NCCL = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}


@dataclass
class SocketSettings:
    """NCCL's socket transport: helper threads per connection and sockets per thread (None: NCCL's default)."""
    threads: int | None = None
    socks_per_thread: int | None = None

    def environment(self) -> dict[str, str]:
        env = {}
        if self.threads is not None:
            env["NCCL_SOCKET_NTHREADS"] = str(self.threads)
        if self.socks_per_thread is not None:
            env["NCCL_NSOCKS_PERTHREAD"] = str(self.socks_per_thread)
        return env

    def describe(self) -> str:
        return (f"NCCL_SOCKET_NTHREADS={self.threads if self.threads is not None else 'default'}, "
                f"NCCL_NSOCKS_PERTHREAD={self.socks_per_thread if self.socks_per_thread is not None else 'default'}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpus(base: dict[str, str], count: int) -> list[str]:
    """The device each simulated machine is shown: the r-th of CUDA_VISIBLE_DEVICES when set, else r."""
    listed = [d.strip() for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if len(listed) >= count else [str(r) for r in range(count)]


def rank_environments(gpus: int, port: int, base: dict[str, str], transport: str = "local",
                      sockets: SocketSettings | None = None) -> list[dict[str, str]]:
    """What each of `gpus` ranks is started with: torchrun's variables, and for the network transport
    one GPU per rank and the NCCL variables above."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} is not one of {TRANSPORTS}")
    devices = visible_gpus(base, gpus)
    envs = []
    for rank in range(gpus):
        env = dict(base)
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.update(RANK=str(rank), WORLD_SIZE=str(gpus), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if transport == "local":
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(gpus))
        else:
            env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CUDA_VISIBLE_DEVICES=devices[rank], **NETWORK_NCCL)
            env.setdefault("NCCL_IB_DISABLE", "1")
            env.update((sockets or SocketSettings()).environment())
        envs.append(env)
    return envs


def run_ranks(cmd: list[str], envs: list[dict[str, str]], timeout_s: float) -> list[RunOutput]:
    """Starts every rank, waits for all; a rank that overstays the timeout is killed (returncode None)."""
    procs = []
    try:
        for env in envs:
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          errors="replace"))
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout_s)
                outs.append(RunOutput(p.returncode, out, err, timeout_s))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                outs.append(RunOutput(None, out, err, timeout_s))
        return outs
    finally:  # Ctrl-C (or a rank that cannot start) must not leave the other ranks running
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def as_one_run(outs: list[RunOutput]) -> RunOutput:
    """The ranks' runs as one: rank 0's output (it alone prints), failed as the first rank that failed
    (its last error line, named by rank), as `bin/train --gpus N` reports it."""
    first = outs[0]
    for rank, out in enumerate(outs):
        if out.returncode != 0:
            why = last_line(out.stderr) or ("timed out" if out.returncode is None else f"exit code {out.returncode}")
            return RunOutput(out.returncode, first.stdout, f"{first.stderr}rank {rank}: {why}\n", out.timeout_s)
    return first
