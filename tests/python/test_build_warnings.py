"""Sources that once warned, compiled as the Makefile compiles them plus -Werror: a warning in every
`make` hides the one that matters."""

import os
import subprocess
import tempfile
import unittest

from tests.python import REPO

# src/core/format.cpp: GCC 12's -Wrestrict inside std::string::insert (with_commas), issue 38.
CLEAN = ["src/core/format.cpp"]


def compile_command(source: str) -> list[str]:
    """The Makefile's command for the source's object (make -n -B prints it, builds nothing)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    obj = "build/obj/" + source.removeprefix("src/").removesuffix(".cpp") + ".o"
    p = subprocess.run(["make", "-n", "-B", obj], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    line = next((l for l in p.stdout.splitlines() if f"-c {source} " in l), None)
    assert line, f"make -n -B {obj} printed no compile command: {p.stdout[-500:]}{p.stderr[-500:]}"
    return line.split()


class NoWarnings(unittest.TestCase):
    def test_each_source_compiles_without_a_warning(self):
        for source in CLEAN:
            with self.subTest(source=source), tempfile.TemporaryDirectory() as d:
                cmd = compile_command(source)
                cmd[cmd.index("-o") + 1] = os.path.join(d, "x.o")
                cmd = [c for c in cmd if c not in ("-MMD", "-MP")]
                p = subprocess.run(cmd + ["-Werror"], cwd=REPO, capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])


if __name__ == "__main__":
    unittest.main()
