"""The Makefile's `make custom NAME=...` and its set-up's package list, dry runs only (make -n builds
nothing), and docs/setup.md's quote of a Makefile line."""

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

    def test_name_from_the_environment_does_not_stop_other_targets(self):
        p = make_n("bin/train", env_name="train")
        self.assertEqual(p.returncode, 0, p.stderr)


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
