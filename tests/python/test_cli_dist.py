"""bin/train's several-GPU command line as a user meets it without the GPUs it asks for: `--gpus N`,
a rank started by a launcher whose other ranks never come, and launcher variables that are partial
or contradictory. Each ends with exactly one "error: ..." line and the right exit code, within 30 s
(the rendezvous timeout is minutes: a rank must not wait for peers on a machine that cannot run it).

Like the other command-line tests of bin/train (cli_harness.py), the runs hide the GPU
(CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine with one.
"""

import os
import time
import unittest

from tests.python.cli_harness import TRAIN, TrainCliHarness

SMALL = ["--data", "synthetic", "--synthetic-size", "256", "--batch", "32"]
LAUNCH_VARIABLES = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                    "MASTER_ADDR", "MASTER_PORT"]


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class DistCli(TrainCliHarness, unittest.TestCase):
    """Reuses the harness of bin/train's command-line tests: its scratch directory and checks."""

    def run_with_env(self, env, *args):
        saved = {k: os.environ.get(k) for k in LAUNCH_VARIABLES}
        for k in LAUNCH_VARIABLES:
            os.environ.pop(k, None)
        os.environ.update(env)
        try:
            t0 = time.monotonic()
            p = self.run_train(*args)
            return p, time.monotonic() - t0
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_gpus_without_gpus_exits_1_with_one_line(self):
        p, seconds = self.run_with_env({}, "--gpus", "2", *SMALL)
        self.assert_one_error_line(p, 1, "no CUDA device")
        self.assertLess(seconds, 30)

    def test_a_rank_whose_peers_cannot_come_exits_1_with_one_line(self):
        env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
        p, seconds = self.run_with_env(env)  # the default data set, as the command has it
        line = self.assert_one_error_line(p, 1, "rank 1", "no CUDA device")
        self.assertLess(seconds, 30, line)
        self.assertEqual(p.stdout, "", "only rank 0 prints")

    def test_partial_launcher_variables_exit_1_naming_the_missing_one(self):
        p, _ = self.run_with_env({"RANK": "1", "WORLD_SIZE": "2"}, *SMALL)
        self.assert_one_error_line(p, 1, "LOCAL_RANK")

    def test_contradictory_launcher_variables_exit_1(self):
        env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "1",
               "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
        p, _ = self.run_with_env(env, *SMALL)
        self.assert_one_error_line(p, 1, "RANK=0", "OMPI_COMM_WORLD_RANK=1", "contradict")

    def test_missing_master_addr_exits_1(self):
        p, _ = self.run_with_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, *SMALL)
        self.assert_one_error_line(p, 1, "MASTER_ADDR is not set")

    def test_gpus_inside_a_launcher_exits_2(self):
        p, _ = self.run_with_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "--gpus", "2", *SMALL)
        self.assert_one_error_line(p, 2, "--gpus", "rank 0 of 2")

    def test_bad_distributed_flags_exit_2(self):
        self.assert_one_error_line(self.run_train("--allreduce-dtype", "bf16"), 2, "--allreduce-dtype")
        self.assert_one_error_line(self.run_train("--gpus", "0"), 2, "--gpus")
        self.assert_one_error_line(self.run_train("--bucket-mb", "-1"), 2, "--bucket-mb")
        self.assert_one_error_line(self.run_train("--dist-timeout", "0"), 2, "--dist-timeout")
        self.assert_one_error_line(self.run_train("--grad-compression", "powersgd"), 2, "--grad-compression",
                                   "not none or int8")
        self.assert_one_error_line(self.run_train("--accumulate", "0"), 2, "--accumulate")
        self.assert_one_error_line(self.run_train("--last-bucket-mb", "-1"), 2, "--last-bucket-mb")
        self.assert_one_error_line(self.run_train("--grad-compression", "int8", "--allreduce-dtype", "fp32"), 2,
                                   "--allreduce-dtype fp32 and --grad-compression int8", "give one")

    def test_more_ranks_than_int8_can_sum_exit_1_before_any_rank_waits(self):
        # 128 ranks cannot sum int8 values: refused with one line, not after a rendezvous of 128.
        env = {"WORLD_SIZE": "128", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}
        p, seconds = self.run_with_env(env, "--data", "synthetic", "--synthetic-size", "4096", "--batch", "32",
                                       "--grad-compression", "int8")
        self.assert_one_error_line(p, 1, "at most 127 ranks (this run has 128)")
        self.assertLess(seconds, 30)


if __name__ == "__main__":
    unittest.main()
