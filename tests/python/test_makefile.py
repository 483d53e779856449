"""The Makefile's `make custom NAME=...`, its set-up's package list and the parallel build of `make run`
and `make test`, dry runs only (make -n builds nothing), and docs/setup.md's quote of a Makefile line."""

import os
import re
import subprocess
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO

# The variants whose defines are fixed (the ladder, bin/train and the two non-rungs).
FIXED = {"baseline": "bin/train-baseline", "wgradstream": "bin/train-wgradstream", "train": "bin/train",
         "fp32-nhwc": "bin/train-fp32-nhwc", "ddp-naive": "bin/train-ddp-naive"}


def make_n(*args, env_name=None):
    # Without the MAKEFLAGS of a make that runs this test (make test NAME=... would reach this make).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "NAME")}
    if env_name:
        env["NAME"] = env_name
    return subprocess.run(["make", "-n", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


class CustomName(unittest.TestCase):
    def test_a_fixed_variant_name_is_refused(self):
        for name, binary in FIXED.items():
            p = make_n("custom", f"NAME={name}", "FP16=1")
            self.assertEqual(p.returncode, 2, f"NAME={name}: {p.stderr}")
            self.assertEqual(p.stdout, "", name)  # stopped before any command
            self.assertRegex(p.stderr.strip(), rf"^Makefile:\d+: \*\*\* make custom: NAME={name} is taken by {binary}, "
                                               rf"which keeps its own defines; choose another NAME, e.g. "
                                               rf"NAME=my-{name}\.  Stop\.$")

    def test_another_name_builds_with_the_defines_given(self):
        p = make_n("custom", "NAME=makefile-test", "FP16=0", "NHWC=0")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"-DOPT_FP16=0 -DOPT_NHWC=0 .*-DVARIANT_NAME='\"train-makefile-test\"'")
        self.assertRegex(p.stdout, r"(?m) -o bin/train-makefile-test ")

    def test_a_name_that_is_not_one_word_of_safe_characters_is_refused_before_any_command(self):
        # NAME=../../tmp/evil wrote build/../../tmp/evil/programs/train.o, outside the tree, then failed.
        for name in ("../../tmp/evil", "a/b", "a b", "-x", ".hidden", "", "a$$b"):
            with self.subTest(name=name):
                p = make_n("custom", f"NAME={name}")
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stdout, "")
                self.assertIn(f"make custom: NAME='{name.replace('$$', '$')}' is not a name: one word of letters, "
                              "digits, '-', '_' and '.'", p.stderr)
        p = make_n("custom", "NAME=My-variant_2.1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"(?m) -o bin/train-My-variant_2\.1 ")

    def test_name_from_the_environment_does_not_stop_other_targets(self):
        p = make_n("bin/train", env_name="train")
        self.assertEqual(p.returncode, 0, p.stderr)


class ParallelByDefault(unittest.TestCase):
    """make run and make test build on every core unless a -j is given: one nvcc at a time, `make run
    GPUS=4` spent 237 s building bin/train on a 64-core machine. Read from the data base make prints
    (-p): the MAKEFLAGS it builds with."""

    @staticmethod
    def makeflags(*args):
        p = make_n("-p", *args)
        m = re.search(r"(?m)^MAKEFLAGS = (.*)$", p.stdout)
        assert m, p.stderr[-2000:]
        return m.group(1).split()

    def test_run_and_test_take_every_core(self):
        cores = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
        for goal in ("run", "test"):
            with self.subTest(goal=goal):
                self.assertIn(f"-j{cores}", self.makeflags(goal))

    def test_a_j_given_wins(self):
        # .ci/run calls make -j"$(nproc)" test; make -j1 is the way to a serial build.
        for given in ("-j3", "-j1"):
            with self.subTest(given=given):
                jobs = [f for f in self.makeflags(given, "test") if f.startswith("-j")]
                self.assertEqual(jobs, [given])

    def test_other_goals_and_clean_stay_as_make_has_them(self):
        # clean beside test would run while the build goes on; plain make keeps make's own default.
        for goals in (["bin/train"], ["clean", "test"]):
            with self.subTest(goals=goals):
                self.assertEqual([f for f in self.makeflags(*goals) if f.startswith("-j")], [])


class SetUpPackages(unittest.TestCase):
    """build/.deps-ok installs dataset-fashion-mnist only when bin/train would find no Fashion-MNIST."""

    def packages(self, *variables):
        p = make_n("-B", "build/.deps-ok", *variables)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r'pkgs="([^"]*)"', p.stdout)
        self.assertIsNotNone(m, p.stdout)
        return m.group(1).split()

    def test_the_package_only_where_no_directory_holds_the_files(self):
        if list((REPO / "data" / "fashion-mnist").glob("train-images-idx3-ubyte*")):
            self.skipTest("data/fashion-mnist holds Fashion-MNIST: the package is never wanted here")
        with tempfile.TemporaryDirectory() as d:
            nowhere = f"FASHION_MNIST_PACKAGE_DIR={d}/no-package"
            self.assertIn("dataset-fashion-mnist", self.packages(f"FASHION_MNIST_DIR={d}/missing", nowhere),
                          "a FASHION_MNIST_DIR that does not exist holds nothing")
            (Path(d) / "train-images-idx3-ubyte.gz.part").write_bytes(b"")  # a download cut short: not the files
            self.assertIn("dataset-fashion-mnist", self.packages(f"FASHION_MNIST_DIR={d}", nowhere))
            for name in ("train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"):
                (Path(d) / name).write_bytes(b"")
                self.assertNotIn("dataset-fashion-mnist", self.packages(f"FASHION_MNIST_DIR={d}", nowhere), name)
                (Path(d) / name).unlink()


class SetupDocQuotesTheMakefile(unittest.TestCase):
    def test_make_runs_last_line_names_the_line_of_its_bin_train_command(self):
        # make names the recipe line that failed: docs/setup.md's sample of `make run` without a GPU.
        quoted = re.findall(r"make: \*\*\* \[Makefile:(\d+): run\] Error 1", (REPO / "docs" / "setup.md").read_text())
        self.assertEqual(len(quoted), 1, quoted)
        lines = (REPO / "Makefile").read_text().splitlines()
        run = lines.index("run: bin/train")
        command = next(i for i in range(run + 1, len(lines)) if lines[i].startswith("\t./bin/train"))
        self.assertEqual(int(quoted[0]), command + 1)


if __name__ == "__main__":
    unittest.main()
