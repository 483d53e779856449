"""The several-GPU bench scripts: bench/scaling.py (`make bench-scaling`) and bench/profile_ranks.py
(`make profile GPUS=N`), the ranks they start (lib/ranks.py: on one machine, or as machines
simulated on it with NCCL on its socket transport), and the all-reduce overlap read from an nsys
kernel trace (nsys_summary.allreduce_time). Pure parts on hand-made data; the scripts end to end
against fake nvidia-smi and fake trainer binaries (no GPU needed).
"""

import contextlib
import io
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from unittest import mock

from tests.python import FIXTURES
from tests.python.fakes import FakeMachine, _write_executable

import profile_ranks  # bench/, on sys.path through tests/python/__init__.py
import scaling
from lib import nsys_summary, ranks, runner
from lib.timeline import ProfileSummary, Stat

# A trainer stand-in: its --json summary reports images/s that scale by 0.9 per added GPU for
# bin/train and by 0.8 for bin/train-ddp-naive, and an exposed all-reduce time.
FAKE_DDP_TRAINER = textwrap.dedent('''
    import json, os, sys
    args = sys.argv[1:]
    gpus = int(args[args.index("--gpus") + 1]) if "--gpus" in args else int(os.environ.get("WORLD_SIZE", "1"))
    batch = int(args[args.index("--batch") + 1])
    if os.environ.get("RANK", "0") != "0":
        sys.exit(0)  # a rank of several: rank 0 alone prints
    network = os.environ.get("NCCL_P2P_DISABLE") == "1" and os.environ.get("LOCAL_RANK") == "0" and gpus > 1
    per_gpu = 1000.0 * ({factor} if gpus > 1 else 1.0) * (0.5 if network else 1.0)
    summary = {{"event": "summary", "variant": "{variant}", "images_per_s": per_gpu * gpus,
                "ms_per_step": 1000.0 * batch / per_gpu, "allreduce_exposed_ms_per_step": 0.25 * (gpus > 1),
                "gpu": "NVIDIA H200", "date": "2026-11-24"}}
    if gpus > 1:
        summary["allreduce"] = {{"bytes_per_step": 47.2e6, "reduced_as": "fp16", "buckets": 3,
                                "ranks": {{"0": {{"steps": 100, "busy_ms_per_step": 12.5, "exposed_ms_per_step": 0.25,
                                                "busbw_gbs": 3.776}}}}, "nccl": {{}}}}
    print(json.dumps(summary))
''')

# nsys as profile_ranks.py runs it: `profile` expands %q{{RANK}} from the rank's environment and writes
# the report where -o says (into a directory that must exist), then runs the trainer; `stats` writes
# the recorded train-baseline CSVs (no NCCL kernels in them) under --output's prefix.
FAKE_RANK_NSYS = textwrap.dedent('''
    import os, shutil, subprocess, sys
    from pathlib import Path
    args = sys.argv[1:]
    if args[0] == "profile":
        out = args[args.index("-o") + 1].replace("%q{{RANK}}", os.environ["RANK"])
        Path(out + ".nsys-rep").write_text("fake report")
        sys.exit(subprocess.run(args[args.index("-o") + 2:]).returncode)
    prefix = args[args.index("--output") + 1]
    for recorded in Path({fixtures!r}).glob("train-baseline_*.csv"):
        shutil.copy(recorded, prefix + recorded.name[len("train-baseline"):])
''')


def trace_only_nsys(directory: Path, csv_text: str) -> Path:
    """An nsys in directory whose stats write <prefix>_cuda_gpu_trace.csv alone, holding csv_text."""
    nsys = directory / "nsys"
    _write_executable(nsys, textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        out = sys.argv[sys.argv.index("--output") + 1]
        open(out + "_cuda_gpu_trace.csv", "w").write({csv_text!r})
        """))
    return nsys


def trace_row(name, start, duration):
    return {"Start (ns)": str(start), "Duration (ns)": str(duration), "Name": name}


class AllReduceTime(unittest.TestCase):
    def test_hidden_is_the_overlap_with_other_kernels(self):
        rows = [trace_row("ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0, 100),
                trace_row("ncclKernel_AllReduce_RING_LL_Sum_half(ncclWorkElem)", 200, 100),
                trace_row("sm90_xmma_dgrad_implicit_gemm", 50, 200),   # backward: 50..250
                trace_row("[CUDA memcpy Host-to-Device]", 0, 300)]      # a copy hides nothing
        total, hidden = nsys_summary.allreduce_time(rows)
        self.assertEqual(total, 200)
        self.assertEqual(hidden, 100)

    def test_overlapping_nccl_kernels_count_once_and_no_nccl_is_zero(self):
        rows = [trace_row("ncclDevKernel_AllReduce", 0, 100), trace_row("ncclDevKernel_AllReduce", 50, 100)]
        self.assertEqual(nsys_summary.allreduce_time(rows), (150, 0))
        self.assertEqual(nsys_summary.allreduce_time([trace_row("bn_apply", 0, 10)]), (0, 0))

    def test_intersection(self):
        self.assertEqual(nsys_summary.intersection_ns([(0, 10), (20, 30)], [(5, 25)]), 10)
        self.assertEqual(nsys_summary.intersection_ns([], [(0, 5)]), 0)


class ScalingTable(unittest.TestCase):
    def test_default_gpu_counts(self):
        self.assertEqual(scaling.default_counts(1), [1])
        self.assertEqual(scaling.default_counts(8), [1, 2, 4, 8])
        self.assertEqual(scaling.default_counts(6), [1, 2, 4, 6])

    def test_command_starts_ranks_only_for_several_gpus(self):
        args = scaling.parse_args(["--batch", "64", "--extra", "--allreduce-dtype fp32"])
        one = scaling.command(Path("bin/train"), 1, args)
        two = scaling.command(Path("bin/train"), 2, args)
        self.assertNotIn("--gpus", one)
        self.assertEqual(two[1:3], ["--gpus", "2"])
        self.assertIn("--json", two)
        self.assertEqual(two[-2:], ["--allreduce-dtype", "fp32"])
        self.assertEqual(two[two.index("--batch") + 1], "64")  # per GPU

    def test_network_transport_starts_one_process_per_rank_without_gpus(self):
        args = scaling.parse_args(["--transport", "network", "--socket-threads", "4", "--socks-per-thread", "4"])
        two = scaling.command(Path("bin/train"), 2, args)
        self.assertNotIn("--gpus", two)  # each rank is started on its own (lib/ranks.py)
        self.assertEqual(args.sockets.environment(), {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"})
        self.assertEqual(scaling.micro_batches(["--accumulate", "4"]), 4)
        self.assertEqual(scaling.micro_batches(["--accumulate=2", "--lr", "0.1"]), 2)
        self.assertEqual(scaling.micro_batches([]), 1)

    def test_socket_settings_need_the_network_transport_and_nccls_limit(self):
        for argv, message in ((["--socket-threads", "4"], "need --transport network"),
                              (["--transport", "network", "--socket-threads", "0"], "between 1 and 64"),
                              (["--transport", "network", "--socket-threads", "16", "--socks-per-thread", "8"],
                               "at most 64")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                scaling.parse_args(argv)
            self.assertIn(message, err.getvalue(), argv)

    def test_allreduce_columns_from_the_summary(self):
        summary = {"images_per_s": 1800.0, "ms_per_step": 10.0, "allreduce_exposed_ms_per_step": 2.5,
                   "allreduce": {"bytes_per_step": 23.6e6, "ranks": {"0": {"busbw_gbs": 4.5}}}}
        point = scaling.make_point("train", 2, 128, [summary])
        self.assertEqual((point.exposed_ms, point.mb_per_step, point.busbw_gbs), (2.5, 23.6, 4.5))
        self.assertEqual(scaling.allreduce_of({"images_per_s": 1.0}), (None, None))
        self.assertEqual(scaling.allreduce_of({"allreduce": {"bytes_per_step": None, "ranks": {}}}), (None, None))

    def test_efficiency_is_against_n_times_one_gpu_of_the_same_binary(self):
        def summary(ips, exposed=None):
            return {"images_per_s": ips, "ms_per_step": 10.0, "allreduce_exposed_ms_per_step": exposed}
        points = [scaling.make_point("train", 1, 128, [summary(1000), summary(1010), summary(990)]),
                  scaling.make_point("train", 2, 128, [summary(1900, 0.2), summary(1950, 0.3)]),
                  scaling.make_point("train-ddp-naive", 1, 128, [summary(1000)]),
                  scaling.make_point("train-ddp-naive", 2, 128, ["exit code 1", summary(1600, 0.9)])]
        self.assertAlmostEqual(scaling.efficiency(points[1], points), 1925 / 2000)
        self.assertAlmostEqual(scaling.efficiency(points[3], points), 0.8)
        md = scaling.markdown(points)
        self.assertIn("| train | 2 | 256 | 1,925 (1,900–1,950) | 962 | 96.2% | 10.00 | 0.250 | — | — |", md)
        self.assertIn("1 of 2 runs failed: exit code 1", md)
        self.assertIn("| train | 1 | 128 | 1,000 (990–1,010) | 1,000 | 100.0% | 10.00 | — | — | — |", md)


class Scripts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-multi-gpu-scripts-")
        self.addCleanup(self.tmp.cleanup)
        self.machine = FakeMachine(Path(self.tmp.name))

    def gpus(self, n):
        listing = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i}-fake)'\n" for i in range(n))
        _write_executable(self.machine.tools / "nvidia-smi", "#!/bin/sh\n" + listing)

    def fake_binary(self, variant, factor):
        _write_executable(self.machine.bin_dir / variant, f"#!{sys.executable}\n" +
                          FAKE_DDP_TRAINER.format(variant=variant, factor=factor))

    def test_scaling_end_to_end(self):
        self.gpus(2)
        self.fake_binary("train", 0.9)
        self.fake_binary("train-ddp-naive", 0.8)
        out = Path(self.tmp.name) / "results"
        p = self.machine.run_script("scaling.py", "--runs", "1", "--bin-dir", str(self.machine.bin_dir),
                                    "--out", str(out))
        self.assertEqual(p.returncode, 0, p.stderr)
        md = next(out.glob("scaling-nvidia-h200-*.md")).read_text()
        self.assertIn("| train | 2 | 256 | 1,800 | 900 | 90.0% | 142.22 | 0.250 | 47.2 | 3.78 |", md)
        self.assertIn("| train-ddp-naive | 2 | 256 | 1,600 | 800 | 80.0% |", md)
        self.assertIn("transport: local", md)
        self.assertTrue(next(out.glob("scaling-*.csv")).read_text().startswith("variant,GPUs,"))

    def test_scaling_over_the_network_transport_end_to_end(self):
        # The fake trainer halves its speed when started as a simulated machine (one rank of several,
        # LOCAL_RANK=0, NCCL off peer-to-peer): the table must come from such ranks.
        self.gpus(2)
        self.fake_binary("train", 0.9)
        out = Path(self.tmp.name) / "results"
        p = self.machine.run_script("scaling.py", "--variants", "train", "--runs", "1", "--transport", "network",
                                    "--socket-threads", "2", "--bin-dir", str(self.machine.bin_dir), "--out", str(out))
        self.assertEqual(p.returncode, 0, p.stderr)
        md = next(out.glob("scaling-network-nvidia-h200-*.md")).read_text()
        self.assertIn("| train | 2 | 256 | 900 | 450 | 45.0% |", md)
        self.assertIn("transport: network", md)
        self.assertIn("NCCL_SOCKET_NTHREADS=2, NCCL_NSOCKS_PERTHREAD=default", md)

    def test_scaling_over_the_network_names_the_rank_that_failed(self):
        self.gpus(2)
        _write_executable(self.machine.bin_dir / "train", f"#!{sys.executable}\n" + textwrap.dedent('''
            import json, os, sys
            if os.environ.get("RANK") == "1":
                print("error: rank 1: NCCL failed", file=sys.stderr)
                sys.exit(1)
            print(json.dumps({"event": "summary", "images_per_s": 1000.0, "ms_per_step": 100.0,
                              "gpu": "NVIDIA H200", "date": "2026-11-24"}))
            '''))
        out = Path(self.tmp.name) / "results"
        p = self.machine.run_script("scaling.py", "--variants", "train", "--runs", "1", "--transport", "network",
                                    "--bin-dir", str(self.machine.bin_dir), "--out", str(out))
        self.assertEqual(p.returncode, 0, p.stderr)  # one GPU ran
        self.assertIn("| train | 2 | 256 | failed: rank 1: error: rank 1: NCCL failed |", p.stdout)

    def test_scaling_with_every_run_failed_says_so_as_the_other_tools_do_and_writes_nothing(self):
        self.gpus(2)
        _write_executable(self.machine.bin_dir / "train", "#!/bin/sh\necho 'error: NCCL timeout' >&2\nexit 1\n")
        out = Path(self.tmp.name) / "results"
        out.mkdir()
        earlier = out / f"scaling-nvidia-h200-{runner.today()}.md"
        earlier.write_text("a good earlier result\n")
        p = self.machine.run_script("scaling.py", "--variants", "train", "--runs", "1", "--bin-dir",
                                    str(self.machine.bin_dir), "--out", str(out))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stderr.splitlines()[-1],
                         "bench-scaling: every run failed (the last: error: NCCL timeout); no results written")
        self.assertIn("| train | 2 | 256 | failed: error: NCCL timeout |", p.stdout)  # the table, as bench.py prints it
        self.assertEqual(earlier.read_text(), "a good earlier result\n")
        self.assertEqual(sorted(f.name for f in out.iterdir()), [earlier.name])

    def test_scaling_refuses_more_gpus_than_the_machine_has(self):
        self.gpus(1)
        self.fake_binary("train", 0.9)
        p = self.machine.run_script("scaling.py", "--gpus", "1,2", "--bin-dir", str(self.machine.bin_dir))
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stderr.strip(), "bench-scaling: --gpus 2 needs 2 GPUs; this machine has 1")

    def profile_ranks_machine(self):
        """Two GPUs, bin/train and an nsys that profiles each rank."""
        self.gpus(2)
        self.fake_binary("train", 0.9)
        _write_executable(self.machine.tools / "nsys", f"#!{sys.executable}\n" +
                          FAKE_RANK_NSYS.format(fixtures=str(FIXTURES / "nsys")))

    def run_profile_ranks(self, out, results):
        return self.machine.run_script("profile_ranks.py", "--gpus", "2", "--bin-dir", str(self.machine.bin_dir),
                                       "--out", str(out), "--results", str(results))

    def test_profile_ranks_makes_its_out_directory(self):
        # The default --out (bench/out/profile) is git-ignored: a fresh clone has none.
        self.profile_ranks_machine()
        out, results = Path(self.tmp.name) / "fresh" / "profile", Path(self.tmp.name) / "results"
        p = self.run_profile_ranks(out, results)
        self.assertEqual(p.returncode, 0, p.stderr)
        for rank in (0, 1):
            self.assertTrue((out / f"train-2gpu_{rank}.nsys-rep").is_file())
            self.assertIn(f"## rank {rank} (nsys, 30 steps)", (out / f"train-2gpu_{rank}.md").read_text())
        combined = (results / "profiles-2gpu-nvidia-h200-2026-11-24.md").read_text()
        self.assertIn("| 1 | 41.390 | 68.5 | 0.000 | 0.000 | 0.000 | — |", combined)

    def test_profile_ranks_a_failed_write_of_a_ranks_report_is_one_line(self):
        self.profile_ranks_machine()
        out, results = Path(self.tmp.name) / "profile", Path(self.tmp.name) / "results"
        (out / "train-2gpu_1.md").mkdir(parents=True)  # where rank 1's report goes
        p = self.run_profile_ranks(out, results)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stderr.splitlines()[-1], f"profile: cannot write {out / 'train-2gpu_1.md'}: Is a directory")
        self.assertFalse(results.exists(), "no combined report after a failed write")

    def test_profile_ranks_refuses_more_gpus_than_the_machine_has_and_needs_nsys(self):
        self.gpus(1)
        self.fake_binary("train", 0.9)
        p = self.machine.run_script("profile_ranks.py", "--gpus", "2", "--bin-dir", str(self.machine.bin_dir))
        self.assertEqual(p.returncode, 2)
        self.assertIn("--gpus 2 needs 2 GPUs; this machine has 1", p.stderr)
        self.gpus(2)
        p = self.machine.run_script("profile_ranks.py", "--gpus", "2", "--bin-dir", str(self.machine.bin_dir))
        self.assertEqual(p.returncode, 2)
        self.assertIn("nsys not found", p.stderr)


class RankEnvironments(unittest.TestCase):
    def test_network_ranks_are_machines_of_one_gpu_on_the_socket_transport(self):
        envs = ranks.rank_environments(2, 29601, {"PATH": "/bin"}, "network", ranks.SocketSettings(4, 8))
        self.assertEqual([e["RANK"] for e in envs], ["0", "1"])
        self.assertEqual([e["LOCAL_RANK"] for e in envs], ["0", "0"])  # each "machine" shows one GPU
        self.assertEqual([e["CUDA_VISIBLE_DEVICES"] for e in envs], ["0", "1"])
        for e in envs:
            self.assertEqual((e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]),
                             ("2", "1", "127.0.0.1", "29601"))
            self.assertEqual((e["NCCL_P2P_DISABLE"], e["NCCL_SHM_DISABLE"], e["NCCL_SOCKET_IFNAME"]), ("1", "1", "lo"))
            self.assertEqual((e["NCCL_IB_DISABLE"], e["NCCL_NVLS_ENABLE"]), ("1", "0"))
            self.assertEqual((e["NCCL_SOCKET_NTHREADS"], e["NCCL_NSOCKS_PERTHREAD"]), ("4", "8"))

    def test_the_users_choices_are_kept_where_they_make_sense(self):
        base = {"CUDA_VISIBLE_DEVICES": "2,3", "NCCL_IB_DISABLE": "0", "NCCL_NVLS_ENABLE": "1"}
        envs = ranks.rank_environments(2, 1, base, "network")
        self.assertEqual([e["CUDA_VISIBLE_DEVICES"] for e in envs], ["2", "3"])  # the GPUs the user showed
        self.assertEqual({e["NCCL_IB_DISABLE"] for e in envs}, {"0"})
        self.assertEqual({e["NCCL_NVLS_ENABLE"] for e in envs}, {"1"})
        self.assertNotIn("NCCL_SOCKET_NTHREADS", envs[0])  # NCCL's default
        local = ranks.rank_environments(2, 1, {"PATH": "/bin"})
        self.assertEqual([e["LOCAL_RANK"] for e in local], ["0", "1"])
        self.assertNotIn("NCCL_P2P_DISABLE", local[0])
        self.assertNotIn("CUDA_VISIBLE_DEVICES", local[0])
        with self.assertRaises(ValueError):
            ranks.rank_environments(2, 1, {}, "infiniband")

    def test_ranks_as_one_run(self):
        ok = runner.RunOutput(0, "summary\n", "", 10)
        failed = runner.RunOutput(1, "", "warning: x\nerror: rank 1: stopping\n", 10)
        self.assertIs(ranks.as_one_run([ok, runner.RunOutput(0, "", "", 10)]), ok)
        one = ranks.as_one_run([ok, failed])
        self.assertEqual((one.returncode, one.stdout), (1, "summary\n"))
        self.assertEqual(runner.last_line(one.stderr), "rank 1: error: rank 1: stopping")
        hung = ranks.as_one_run([ok, runner.RunOutput(None, "", "", 10)])
        self.assertIsNone(hung.returncode)


class ProfileRanks(unittest.TestCase):
    def test_each_rank_gets_torchruns_variables(self):
        envs = profile_ranks.rank_environments(2, 29600, {"PATH": "/bin"})
        self.assertEqual([e["RANK"] for e in envs], ["0", "1"])
        self.assertEqual({e["WORLD_SIZE"] for e in envs}, {"2"})
        self.assertEqual([e["LOCAL_RANK"] for e in envs], ["0", "1"])
        self.assertEqual({(e["MASTER_ADDR"], e["MASTER_PORT"], e["PATH"]) for e in envs}, {("127.0.0.1", "29600", "/bin")})

    def test_one_report_per_rank_over_the_window(self):
        args = profile_ranks.parse_args(["--gpus", "2", "--out", "/tmp/p", "--extra", "--bucket-mb 50"])
        cmd = profile_ranks.profile_command(Path("/usr/bin/nsys"), Path("bin/train"), args)
        self.assertEqual(cmd[:2], ["/usr/bin/nsys", "profile"])
        self.assertIn("--capture-range=cudaProfilerApi", cmd)
        self.assertIn("--cuda-graph-trace=node", cmd)  # bin/train replays its step as a CUDA graph
        self.assertEqual(cmd[cmd.index("-o") + 1], "/tmp/p/train-2gpu_%q{RANK}")
        self.assertIn("bin/train", cmd)
        self.assertEqual(cmd[-2:], ["--bucket-mb", "50"])
        network = profile_ranks.parse_args(["--gpus", "2", "--out", "/tmp/p", "--transport", "network"])
        cmd = profile_ranks.profile_command(Path("/usr/bin/nsys"), Path("bin/train"), network)
        self.assertEqual(cmd[cmd.index("-o") + 1], "/tmp/p/train-2gpu-network_%q{RANK}")

    def test_a_bad_cell_in_a_ranks_gpu_trace_is_one_line_naming_the_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            # its stats write a cuda_gpu_trace whose start is not a number
            nsys = trace_only_nsys(Path(tmp), "Start (ns),Duration (ns),Name\n12x4,100,ncclKernel\n")
            args = profile_ranks.parse_args(["--gpus", "2", "--out", tmp])
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as stop:
                profile_ranks.condense(args, nsys, 0)
            self.assertEqual(stop.exception.code, 1)
            self.assertRegex(err.getvalue(), r"^profile: \S+_0_cuda_gpu_trace\.csv: .12x4. is not a number\n$")

    def test_each_ranks_csvs_are_read_once(self):
        with tempfile.TemporaryDirectory() as tmp:
            # an all-reduce half hidden by another kernel
            nsys = trace_only_nsys(Path(tmp), "Start (ns),Duration (ns),Name\n0,100,ncclDevKernel_AllReduce\n50,100,sgemm\n")
            args = profile_ranks.parse_args(["--gpus", "2", "--out", tmp])
            with mock.patch.object(nsys_summary, "read_rows", wraps=nsys_summary.read_rows) as read_rows:
                rank = profile_ranks.condense(args, nsys, 1)
            self.assertEqual(read_rows.call_count, 1)  # the trace, for the summary and the all-reduce both
            self.assertEqual((rank.rank, rank.allreduce_ns, rank.hidden_ns), (1, 100, 50))
            self.assertEqual((rank.summary.busy_ns, rank.summary.window_ns), (150, 150))

    def test_allreduce_table_per_step(self):
        s = ProfileSummary(variant="rank 0", source="nsys")
        s.phases["step"] = Stat("step", 300_000_000, 30)  # 30 steps, 10 ms each
        s.busy_ns, s.window_ns = 90, 100
        table = profile_ranks.allreduce_table([profile_ranks.RankProfile(0, s, 30_000_000, 24_000_000)])
        self.assertIn("| 0 | 10.000 | 90.0 | 1.000 | 0.800 | 0.200 | 80 |", table)


if __name__ == "__main__":
    unittest.main()
