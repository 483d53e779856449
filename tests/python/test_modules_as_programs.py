"""Every Python file of bench/ and data/ run as a user would: a program prints its usage for --help,
and a module (imported by the programs) says that it is one and which program to run, in one line
with exit status 2. Modules used to print nothing and exit 0, or, needing PyTorch, end in a
ModuleNotFoundError traceback."""

import re
import subprocess
import sys
import unittest

from tests.python import REPO

# The modules issue 38 found silent, and those that needed PyTorch to say anything.
MODULES = ["bench/lib/chart.py", "bench/lib/table.py", "bench/lib/capture.py", "bench/lib/nsys_summary.py",
           "bench/lib/timeline.py", "bench/lib/trace_summary.py", "bench/lib/runner.py", "bench/lib/pytorch_resnet.py",
           "bench/lib/pytorch_data.py", "bench/lib/pytorch_rungs.py", "bench/lib/ranks.py", "data/dataset_files.py",
           "bench/lib/gpu_clocks.py"]
MODULE_LINE = re.compile(r"(\S+) is a module \((.+)\), not a program: run (?:.*?)python3 (\S+\.py)\b.*")


def python_files():
    return sorted(str(p.relative_to(REPO)) for d in ("bench", "data") for p in (REPO / d).rglob("*.py")
                  if p.name != "__init__.py")


def run(path, *args):
    # Without the user's PYTHONPATH or PyTorch's place on it: what a fresh clone sees.
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, path, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


class ModulesAsPrograms(unittest.TestCase):
    def test_each_module_says_it_is_one_and_names_a_program(self):
        for path in MODULES:
            for args in (["--help"], []):
                with self.subTest(path=path, args=args):
                    p = run(path, *args)
                    self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
                    lines = p.stderr.splitlines()
                    self.assertEqual(len(lines), 1, p.stderr)
                    m = MODULE_LINE.fullmatch(lines[0])
                    self.assertIsNotNone(m, lines[0])
                    self.assertEqual(m.group(1), path)
                    self.assertTrue((REPO / m.group(3)).is_file(), f"{path} names {m.group(3)}, which is not there")
                    self.assertNotIn(m.group(3), MODULES)

    def test_every_file_is_a_program_with_a_usage_or_a_module_that_says_so(self):
        # Catches the next module added without the guard (or a program whose --help breaks).
        for path in python_files():
            with self.subTest(path=path):
                p = run(path, "--help")
                self.assertNotIn("Traceback", p.stderr)
                if p.returncode == 0:
                    self.assertTrue(p.stdout.startswith("usage: "), p.stdout[:200])
                else:
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertRegex(p.stderr.strip(), MODULE_LINE)
                    self.assertIn(path, MODULES)


if __name__ == "__main__":
    unittest.main()
