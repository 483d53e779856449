#!/usr/bin/env python3
"""Runs every test suite of the project and ends with one line: "N passed, N failed, N skipped".

Suites: the GoogleTest binary (CPU tests, and GPU tests that skip without a device), the Python
tests of bench/ and of the command line, and a short run of each fuzz target when they are built.
Skipped tests are listed with their reasons. Exit status 1 when anything failed. --suites runs some
of them (gtest, python, fuzz).
"""
import argparse
import json
import re
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GTEST_JSON = os.path.join(ROOT, "build", "gtest-results.json")


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failures = []   # (suite, name, message)
        self.skips = []      # (suite, name, reason)

    def add(self, suite, name, outcome, message=""):
        if outcome == "pass":
            self.passed += 1
        elif outcome == "skip":
            self.skipped += 1
            self.skips.append((suite, name, message))
        else:
            self.failed += 1
            self.failures.append((suite, name, message))


def run_gtest(tally):
    binary = os.path.join(ROOT, "bin", "unit_tests")
    if os.path.exists(GTEST_JSON):
        os.remove(GTEST_JSON)
    print("== GoogleTest: bin/unit_tests", flush=True)
    # Full output is captured (not --gtest_brief) because the JSON report does not carry
    # GTEST_SKIP's message; only the output of failing tests is echoed.
    proc = subprocess.run([binary, f"--gtest_output=json:{GTEST_JSON}"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    reasons = echo_failures_and_collect_skips(proc.stdout)
    if not os.path.exists(GTEST_JSON):
        tally.add("gtest", "bin/unit_tests", "fail", f"crashed before writing results (exit {proc.returncode})")
        return
    with open(GTEST_JSON) as f:
        report = json.load(f)
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite['name']}.{t['name']}"
            if t.get("failures"):
                tally.add("gtest", name, "fail", t["failures"][0].get("failure", "").splitlines()[0])
            elif t.get("result") == "SKIPPED":
                tally.add("gtest", name, "skip", reasons.get(name, "skipped (no reason given)"))
            elif t.get("result") == "COMPLETED":
                tally.add("gtest", name, "pass")
    if proc.returncode not in (0, 1):
        tally.add("gtest", "bin/unit_tests", "fail", f"exited with {proc.returncode}")


def echo_failures_and_collect_skips(output):
    """Prints the output of every test that failed; returns {test name: GTEST_SKIP message}."""
    reasons, current, lines = {}, None, []
    for line in output.splitlines():
        run = re.match(r"\[ RUN +\] (\S+)", line)
        if run:
            current, lines = run.group(1), [line]
            continue
        lines.append(line)
        if current and re.search(r": Skipped$", line):
            reasons[current] = ""
        elif current in reasons and not reasons[current] and line.strip() and not line.startswith("["):
            reasons[current] = line.strip()
        elif current and line.startswith("[  FAILED  ] " + current):
            print("\n".join(lines), flush=True)
            current = None
        elif current and re.match(r"\[ +(OK|SKIPPED) +\] ", line):
            current = None
    if current:  # the binary died inside a test: show how far it got
        print("\n".join(lines), flush=True)
    return reasons


def failure_message(err):
    """The summary's line for a failed check (its message's first line) or an error (type: value)."""
    kind, value = err[0], err[1]
    if issubclass(kind, AssertionError):
        return str(value).splitlines()[0] if str(value) else "failed"
    return f"{kind.__name__}: {value}"


class _Result(unittest.TextTestResult):
    def __init__(self, *a, tally=None, **k):
        super().__init__(*a, **k)
        self.tally = tally

    def addSuccess(self, test):
        super().addSuccess(test)
        self.tally.add("python", test.id(), "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.tally.add("python", test.id(), "fail", failure_message(err))

    def addError(self, test, err):
        super().addError(test, err)
        self.tally.add("python", test.id(), "fail", failure_message(err))

    def addSubTest(self, test, subtest, err):
        # A failing subTest is reported here alone (the test then gets no addFailure or addSuccess):
        # without this, a test that fails only in its subTests would count nowhere and exit 0.
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.tally.add("python", subtest.id(), "fail", failure_message(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.tally.add("python", test.id(), "skip", reason)


def run_python(tally):
    print("== Python: tests/python", flush=True)
    suite = unittest.defaultTestLoader.discover(os.path.join(ROOT, "tests", "python"), top_level_dir=ROOT)
    runner = unittest.TextTestRunner(verbosity=1, resultclass=lambda *a, **k: _Result(*a, tally=tally, **k))
    runner.run(suite)


def run_fuzz_smoke(tally):
    """Each fuzz target briefly over its seed corpus plus random inputs (make fuzz runs them long)."""
    fuzz_dir = os.path.join(ROOT, "build", "fuzz")
    targets = sorted(f for f in os.listdir(fuzz_dir) if f.startswith("fuzz_")) if os.path.isdir(fuzz_dir) else []
    if not targets:
        tally.add("fuzz", "fuzz targets", "skip", "not built: clang with libFuzzer is missing (make fuzz-build)")
        return
    print("== fuzz smoke runs", flush=True)
    runs = os.environ.get("FUZZ_SMOKE_RUNS", "20000")
    for t in targets:
        corpus = os.path.join(fuzz_dir, "corpus", t[len("fuzz_"):])
        # crash inputs go under build/, never into the working tree
        artifacts = os.path.join(fuzz_dir, "artifacts")
        os.makedirs(artifacts, exist_ok=True)
        args = [os.path.join(fuzz_dir, t), f"-runs={runs}", "-max_len=65536", "-rss_limit_mb=4096",
                f"-artifact_prefix={artifacts}/{t}-"]
        if os.path.isdir(corpus):
            args.append(corpus)
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode == 0:
            tally.add("fuzz", t, "pass")
        else:
            tail = [l for l in proc.stderr.splitlines() if "ERROR" in l or "SUMMARY" in l]
            tally.add("fuzz", t, "fail", (tail[0] if tail else f"exit {proc.returncode}") +
                      f" (the input is in {os.path.relpath(artifacts, ROOT)})")


SUITES = {"gtest": run_gtest, "python": run_python, "fuzz": run_fuzz_smoke}


def parse_suites(argv):
    """The suites to run, in the order SUITES has them: all by default, or those of --suites A,B.
    Why a subset: on a GPU the whole run outlasts a 600 s call to a lent machine (docs/testing.md)."""
    parser = argparse.ArgumentParser(description="Runs the test suites and prints one tally line.")
    parser.add_argument("--suites", default=",".join(SUITES),
                        help="comma-separated, of " + ", ".join(SUITES) + " [default: all]")
    names = [n for n in parser.parse_args(argv).suites.split(",") if n]
    unknown = [n for n in names if n not in SUITES]
    if unknown or not names:
        parser.error(f"--suites: {','.join(unknown) or 'none given'}: not one of {', '.join(SUITES)}")
    return [n for n in SUITES if n in names]


def main():
    suites = parse_suites(sys.argv[1:])
    tally = Tally()
    for name in suites:
        SUITES[name](tally)
    if tally.skips:
        print("\nskipped:")
        for suite, name, reason in tally.skips:
            print(f"  [{suite}] {name}: {reason}")
    if tally.failures:
        print("\nFAILED:")
        for suite, name, msg in tally.failures:
            print(f"  [{suite}] {name}: {msg}")
    print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
