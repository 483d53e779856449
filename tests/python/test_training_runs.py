"""bin/train's training runs end to end on the GPU (issue 5): SIGINT and SIGTERM stop a run after the
current step with a checkpoint and exit 0, --deterministic runs give the same per-step losses to
the bit, whether run twice or stopped and resumed half way, and a run that diverges stops with one
error line and exit 1, its --save file holding the last saved state that a step ran from without
diverging, the one that step recomputes.

Every test needs a CUDA device and skips without one, saying "no CUDA device: ...". The runs are
tiny (synthetic data, batch 32, 10 steps an epoch, at most a few dozen steps; a few seconds each on
an H100) and run in a scratch directory. --deterministic throughout: it is what (b) and (c) test,
and it takes cuDNN's heuristics instead of an autotune search, which keeps every run short.

The same tests run for bin/train and, where `make variants` built them, bin/train-baseline (fp32,
synchronous loss reads: the other end of the optimization ladder) and bin/train-cudagraph (the step
replayed as one CUDA graph). The builds with CUDA graphs (bin/train, bin/train-cudagraph) also show
that the graph changes nothing: their --deterministic losses and test results equal, bit for bit,
those of the same binary with --no-cuda-graph, which launches every kernel from the host.
"""

import functools
import importlib.util
import json
import math
import os
import re
import signal
import struct
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

from tests.python import REPO
from tests.python.cli_harness import CRASH_SIGNS

# 320 synthetic images at batch 32: 10 steps an epoch. --epochs fixes the learning-rate schedule, so
# every run of one test passes the same value (a resume warns when it differs).
SMALL = ["--data", "synthetic", "--synthetic-size", "320", "--batch", "32", "--seed", "7", "--no-eval",
         "--deterministic"]
STEPS_PER_EPOCH = 10
RUN_TIMEOUT_S = 300  # per process: generous, a run takes seconds


@functools.lru_cache(maxsize=None)
def no_gpu_reason():
    """Why no CUDA device can be used here (a skip reason), or None when nvidia-smi lists a GPU."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return "no CUDA device: CUDA_VISIBLE_DEVICES is empty (these tests train on the GPU)"
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "no CUDA device: nvidia-smi is not installed (these tests train on the GPU)"
    except subprocess.TimeoutExpired:
        return "no CUDA device: nvidia-smi -L did not answer in 60 s (these tests train on the GPU)"
    if p.returncode != 0:
        said = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return (f"no CUDA device: nvidia-smi -L failed (exit {p.returncode}"
                f"{': ' + said[0] if said else ''}); these tests train on the GPU")
    if not any(line.startswith("GPU ") for line in p.stdout.splitlines()):
        return "no CUDA device: nvidia-smi -L lists no GPU (these tests train on the GPU)"
    return None


class TrainingRuns:
    """The tests, for the binary named by BINARY (a mixin: the classes below pick the binary)."""

    BINARY = None

    def setUp(self):
        reason = no_gpu_reason()
        if reason:
            self.skipTest(reason)
        self.train = REPO / "bin" / self.BINARY
        if not self.train.exists():
            self.skipTest(f"bin/{self.BINARY} is not built ({'make' if self.BINARY == 'train' else 'make variants'})")
        self.tmp = tempfile.TemporaryDirectory(prefix="test-training-runs-")
        self.addCleanup(self.tmp.cleanup)
        self.dir = Path(self.tmp.name)

    # ---- helpers -------------------------------------------------------------------------------

    def check_output(self, args, code, stdout, stderr):
        """The run ended with exit `code`, and nothing in its output looks like a crash."""
        context = f"bin/{self.BINARY} {' '.join(args)}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, stdout + stderr, f"crash-like output\n{context}")
        self.assertEqual(code, 0, f"exit {code}\n{context}")
        self.assertNotIn("error:", stderr, context)
        self.assertNotIn("warning:", stderr, context)  # e.g. a resume with other --seed/--epochs

    def run_train(self, *args, small=True):
        p = self.run_unchecked(*args, small=small)
        self.check_output(p.args[1:], p.returncode, p.stdout, p.stderr)
        return p

    def run_unchecked(self, *args, small=True):
        """Runs the binary with SMALL + args (args alone when not `small`) and returns the
        CompletedProcess, whatever its exit. (A flag may be given once: SMALL's cannot be overridden.)"""
        args = [*(SMALL if small else []), *map(str, args)]
        return subprocess.run([str(self.train), *args], cwd=self.dir, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)

    def loss_log(self, path, first, count):
        """The text of a --loss-log file, after checking it holds steps first..first+count-1, one
        finite loss each. The text itself is what runs are compared by: %.9g is exact for a float."""
        text = Path(path).read_text()
        lines = text.splitlines()
        self.assertEqual([int(line.split()[0]) for line in lines], list(range(first, first + count)), text)
        for line in lines:
            loss = float(line.split()[1])
            self.assertTrue(0 < loss < 100, f"{path}: implausible loss in {line!r}")
        return text

    def test_accumulate_trains_micro_batches_a_step(self):
        # 320 images, 2 micro-batches of 32 a step: 5 steps an epoch, the loss log one line a step.
        log = self.dir / "acc.log"
        # 4 warm-up steps (30 by default), so that the run has a timed window of 6 steps.
        p = self.run_train("--epochs", "2", "--accumulate", "2", "--warmup-steps", "4", "--loss-log", log, "--json")
        self.loss_log(log, 0, 10)
        summary = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"event":"summary"')][-1]
        self.assertEqual((summary["steps"], summary["accumulate"], summary["timed_steps"]), (10, 2, 6))
        # the timed window on the wall clock (what bench/ab.py --clocks keeps samples by): within this run
        start, end = summary["window_start_unix_ms"], summary["window_end_unix_ms"]
        self.assertTrue(time.time() * 1000 - RUN_TIMEOUT_S * 1000 < start <= end <= time.time() * 1000, summary)

    # ---- (a) a signal stops the run with a checkpoint ------------------------------------------

    def check_signal_stops_and_saves(self, sig):
        ck = self.dir / "run.ckpt"
        # 15 epochs (150 steps) is far more than the test lets it run; --save-every 2 makes the
        # checkpoint appear once training is under way (the signal handlers are installed by then).
        args = [*SMALL, "--epochs", "15", "--save", str(ck), "--save-every", "2"]
        proc = subprocess.Popen([str(self.train), *args], cwd=self.dir, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not ck.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is not None or not ck.exists():
                proc.kill()
                out, err = proc.communicate()
                self.fail(f"no checkpoint appeared while bin/{self.BINARY} ran (exit {proc.returncode})\n"
                          f"stdout:\n{out}\nstderr:\n{err}")
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.check_output(args, proc.returncode, out, err)
        m = re.search(r"^stopped by a signal after step (\d+): checkpoint saved to (.+) \(continue with --resume (.+)\)$",
                      out, re.M)
        self.assertIsNotNone(m, f"no 'stopped by a signal' line in:\n{out}")
        step = int(m.group(1))
        self.assertEqual(m.group(2), str(ck))
        self.assertEqual(m.group(3), str(ck))
        self.assertGreaterEqual(step, 2, out)
        self.assertLess(step, 15 * STEPS_PER_EPOCH, f"the run was not stopped early:\n{out}")
        self.assertEqual(list(ck.parent.glob(ck.name + ".tmp*")), [], "a temporary checkpoint file was left behind")
        self.assertFalse(Path(str(ck) + ".pending").exists(), "a pending periodic save was left behind")
        # The checkpoint holds the state after the last step done, and a resume takes it up there.
        p = self.run_train("--epochs", "15", "--resume", ck, "--steps", step + 2)
        self.assertRegex(p.stdout, rf"(?m)^resumed from {re.escape(str(ck))} at step {step} ")
        self.assertRegex(p.stdout, r"(?m)^summary: 2 steps")

    def test_sigint_finishes_the_step_saves_and_exits_0(self):
        self.check_signal_stops_and_saves(signal.SIGINT)

    def test_sigterm_finishes_the_step_saves_and_exits_0(self):
        self.check_signal_stops_and_saves(signal.SIGTERM)

    # ---- (b), (c) deterministic runs -------------------------------------------------------------

    def test_deterministic_resume_continues_the_exact_loss_trajectory(self):
        # 16 steps across the epoch boundary at step 10, against 8 steps, a save, and a resume for 8
        # more that starts inside the first epoch and crosses into the second.
        n, half = 16, 8
        full = self.dir / "full.log"
        self.run_train("--epochs", "2", "--steps", n, "--loss-log", full)
        ck, first, second = self.dir / "half.ckpt", self.dir / "first.log", self.dir / "second.log"
        self.run_train("--epochs", "2", "--steps", half, "--save", ck, "--loss-log", first)
        p = self.run_train("--epochs", "2", "--steps", n, "--resume", ck, "--loss-log", second)
        self.assertRegex(p.stdout, rf"(?m)^resumed from {re.escape(str(ck))} at step {half} ")
        uninterrupted = self.loss_log(full, 0, n)
        resumed = self.loss_log(first, 0, half) + self.loss_log(second, half, n - half)
        self.assertEqual(resumed, uninterrupted,
                         "stopping at a checkpoint and resuming changed the losses (first: resumed, second: "
                         "uninterrupted)")

    def test_two_deterministic_runs_give_identical_losses(self):
        a, b = self.dir / "a.log", self.dir / "b.log"
        p = self.run_train("--epochs", "2", "--steps", 12, "--loss-log", a)
        self.run_train("--epochs", "2", "--steps", 12, "--loss-log", b)
        self.assertRegex(p.stdout, r"(?m)^start-up: data \d+\.\d\d s, GPU \d+\.\d\d s, network \d+\.\d\d s, "
                                   r"loader and step graphs \d+\.\d\d s, start state \d+\.\d\d s; "
                                   r"\d+\.\d\d s since the process began$", "where the start went")
        first, second = self.loss_log(a, 0, 12), self.loss_log(b, 0, 12)
        self.assertEqual(first, second, "two --deterministic runs gave different losses")
        self.assertGreater(len({line.split()[1] for line in first.splitlines()}), 1,
                           f"every step logged the same loss: the log does not follow training\n{first}")

    def test_the_recipe_resumes_bit_for_bit_weight_average_included(self):
        # --ema (its average evaluated after each epoch and saved), --label-smoothing, --tta-flip and
        # --zero-init-residual (the fresh start's only; the resume takes the checkpoint's weights):
        # 20 steps (2 epochs, an evaluation after each) straight, against 8, a save, and a resume for
        # 12 more. The checkpoints at the end hold the same bytes (weights, momentum, BN statistics,
        # the average), and the losses and test results are the same.
        with_eval = [a for a in SMALL if a != "--no-eval"]
        recipe = [*with_eval, "--epochs", "2", "--ema", "0.9", "--label-smoothing", "0.1", "--tta-flip",
                  "--zero-init-residual", "--json"]
        full, full_log = self.dir / "full.ckpt", self.dir / "full.log"
        a = self.run_train(*recipe, "--save", full, "--loss-log", full_log, small=False)
        half, end = self.dir / "half.ckpt", self.dir / "end.ckpt"
        first, second = self.dir / "first.log", self.dir / "second.log"
        self.run_train(*recipe, "--steps", 8, "--save", half, "--loss-log", first, small=False)
        header = self.checkpoint_header(half)
        self.assertEqual(header.get("ema_decay"), "0.9", header)
        self.assertEqual(Path(half).read_bytes()[8:12], (2).to_bytes(4, "little"), "a checkpoint with an average is version 2")
        b = self.run_train(*recipe, "--resume", half, "--save", end, "--loss-log", second, small=False)
        self.assertRegex(b.stdout, rf"(?m)^resumed from {re.escape(str(half))} at step 8 ")
        self.assertEqual(self.loss_log(first, 0, 8) + self.loss_log(second, 8, 12), self.loss_log(full_log, 0, 20),
                         "the resumed run's losses differ")
        self.assertTrue(Path(end).read_bytes() == Path(full).read_bytes(),
                        "the checkpoints after 20 steps differ (weights, momentum, statistics or the average)")

        def events(p, kind):
            lines = (line for line in p.stdout.splitlines() if line.startswith("{"))
            return [e for e in map(json.loads, lines) if e["event"] == kind]
        # (the resumed run finishes the first epoch: both evaluate after steps 10 and 20)
        self.assertEqual([(e["test_loss"], e["test_acc"]) for e in events(b, "epoch")],
                         [(e["test_loss"], e["test_acc"]) for e in events(a, "epoch")],
                         "the resumed run's evaluations differ")
        # --json says when this process's first step has run: once, after step 9 (8 were done)
        self.assertEqual([e["step"] for e in events(b, "first_step")], [9], b.stdout)
        self.assertEqual([e["step"] for e in events(a, "first_step")], [1], a.stdout)

    # ---- (d) divergence stops the run and keeps the last good checkpoint ---------------------------

    def checkpoint_header(self, path):
        """The key=value header of a checkpoint (include/train/checkpoint.h: magic "RN50CKPT", u32 version,
        u32 header length, header text)."""
        data = Path(path).read_bytes()
        self.assertEqual(data[:8], b"RN50CKPT", f"{path} is not a checkpoint")
        (length,) = struct.unpack_from("<I", data, 12)
        lines = data[16:16 + length].decode().splitlines()
        return dict(line.split("=", 1) for line in lines)

    def test_divergence_stops_with_one_error_and_keeps_the_last_good_checkpoint(self):
        # No flag injects a NaN, so the recipe is made absurd: the largest --lr allowed, from the first
        # step (no warm-up), and --wd 1, which multiplies the weights by about -99 per step. Measured on
        # an H100: fp32 has a NaN loss at step 5; fp16 keeps a finite loss, but its gradients overflow
        # from step 1 on, and from --loss-scale 1 eleven halvings take the scale below 1/1024 in step
        # 11. 10 epochs (100 steps) leave that far from the end. --save-every 1 and --progress-every 1
        # make the detection exact: save() reads the counters every step and refuses a diverged state.
        # A periodic save goes to FILE.pending and becomes FILE once a step run from it was applied
        # (not skipped) without a divergence, so FILE keeps the last state that passed that test.
        ck = self.dir / "run.ckpt"
        epochs = 10
        args = ["--epochs", epochs, "--warmup-epochs", "0", "--lr", "100", "--wd", "1", "--loss-scale", "1",
                "--save", ck, "--save-every", "1", "--progress-every", "1"]
        p = self.run_unchecked(*args)
        context = f"bin/{self.BINARY} {' '.join(map(str, p.args[1:]))}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, p.stdout + p.stderr, f"crash-like output\n{context}")
        self.assertEqual(p.returncode, 1, context)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"expected one line on stderr\n{context}")
        self.assertTrue(lines[0].startswith("error: training diverged"), context)
        self.assertNotIn("checkpoint saved to", p.stdout, f"a diverged run saved at its end\n{context}")
        self.assertNotRegex(p.stdout, r"(?m)^summary:", f"a diverged run printed its summary\n{context}")
        build = re.search(r"(?m)^\S+: optimizations \[.*\] -> (fp16|fp32), ", p.stdout)
        self.assertIsNotNone(build, f"no build line\n{context}")
        fp16 = build.group(1) == "fp16"

        # Either message names a 0-based step S, as --loss-log numbers them: a NaN/Inf loss the first
        # such step, non-finite gradients (with a finite loss) the step that gave them (exact here:
        # the counters are read after every step). Both end with the step of the state FILE keeps.
        kept = rf"; stopping without saving; {re.escape(str(ck))} keeps its last good state \(step (?P<kept>\d+)\)$"
        loss_form = re.fullmatch(r"error: training diverged: the loss became NaN/Inf at step (?P<step>\d+) "
                                 r"\(last finite loss (?P<last>\S+)\)" + kept, lines[0])
        grad_form = re.fullmatch(r"error: training diverged at step (?P<step>\d+): non-finite gradients"
                                 + (" even at a tiny loss scale" if fp16 else "")
                                 + r" \(last finite loss (?P<last>\S+)\)" + kept, lines[0])
        m = loss_form or grad_form
        self.assertIsNotNone(m, f"unexpected divergence message\n{context}")
        step, last_loss = int(m.group("step")), float(m.group("last"))
        self.assertGreater(step, 0, context)
        self.assertLess(step, epochs * STEPS_PER_EPOCH, context)
        self.assertTrue(math.isfinite(last_loss), context)

        # The checkpoint: the last proven state, complete and atomic, never one with a diverged
        # scaler, and no unproven pending save left beside it.
        self.assertTrue(ck.exists(), f"no checkpoint was kept\n{context}")
        self.assertEqual(list(ck.parent.glob(ck.name + ".tmp*")), [], "a temporary checkpoint file was left behind")
        self.assertFalse(Path(str(ck) + ".pending").exists(), f"an unproven pending save was left behind\n{context}")
        self.assertEqual(list(ck.parent.glob(ck.name + ".pending.tmp*")), [],
                         "a temporary pending file was left behind")
        header = self.checkpoint_header(ck)
        saved = int(header["step"])
        self.assertEqual(saved, int(m.group("kept")), f"the message names another step than the file holds\n{context}")
        scale = float.fromhex(header["loss_scale"])
        if fp16:
            self.assertGreaterEqual(scale, 2.0 ** -10, f"the checkpoint holds a collapsed loss scale\n{header}")
        else:
            self.assertEqual(scale, 1.0, header)
            self.assertEqual(int(header["skipped_steps"]), 0, f"fp32 skipped a step without stopping\n{header}")
        if not fp16:
            # fp32 diverges in step S itself: the state step S-1 ran from (saved after S-1 steps) is the
            # last one proven; the one saved after S steps, which step S ran from, is not.
            self.assertEqual(saved, step - 1, context)
        elif grad_form:
            # fp16 skips every step from the one after the kept state to S, where the scale collapses:
            # step `saved` was applied (scale unchanged) and steps saved+1..S each halved the scale,
            # the last halving, and only it, taking it below 1/1024.
            halvings = step - saved
            self.assertLess(math.ldexp(scale, -halvings), 2.0 ** -10, f"{header}\n{context}")
            self.assertGreaterEqual(math.ldexp(scale, -(halvings - 1)), 2.0 ** -10, f"{header}\n{context}")
        else:
            # fp16 with a NaN loss in step S: that step was skipped, so it is not the kept state's step.
            self.assertNotEqual(saved, step, context)

        # It is good: the trainer takes it up at the step its header says, and the one step it runs
        # from it (the one that ran fine in the diverged run: --deterministic recomputes it exactly)
        # has a finite loss and is not skipped. The resume keeps the diverged run's rate and warm-up:
        # another --lr would be right to warn that it changes the checkpoint's schedule.
        r = self.run_train("--epochs", epochs, "--warmup-epochs", "0", "--lr", "100", "--wd", "1",
                           "--resume", ck, "--steps", saved + 1, "--json")
        self.assertRegex(r.stdout, rf"(?m)^resumed from {re.escape(str(ck))} at step {saved} ")
        events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        summaries = [e for e in events if e.get("event") == "summary"]
        self.assertEqual(len(summaries), 1, r.stdout)
        summary = summaries[0]
        self.assertEqual(summary["steps"], 1, r.stdout)
        self.assertIsNotNone(summary["final_loss"], f"the step from the kept state had a NaN/Inf loss\n{r.stdout}")
        self.assertTrue(math.isfinite(summary["final_loss"]), r.stdout)
        self.assertEqual(summary["skipped_steps"], int(header["skipped_steps"]),
                         f"the step from the kept state was skipped\n{r.stdout}")

    # ---- (e) an image that does not decode during training ------------------------------------

    def test_an_image_that_does_not_decode_stops_the_run_after_saving(self):
        # A folder of 40 training and 6 test PNGs; one test PNG passes the header check (signature,
        # IHDR, IEND all fine) but its compressed pixels are garbage, so it fails when the first
        # evaluation decodes it: on the main thread in train-baseline, in a loader thread in train.
        # The training images are all decoded for the normalisation at start (fewer than 10,000),
        # which is why the bad one is a test image.
        spec = importlib.util.spec_from_file_location("make_folder", REPO / "data" / "make_folder.py")
        make_folder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_folder)
        root = self.dir / "images"
        for split, n in (("train", 20), ("test", 3)):
            for k, cls in enumerate(("a", "b")):
                (root / split / cls).mkdir(parents=True)
                for i in range(n):
                    pixels = bytes((x * 7 + i * 13 + k * 50) % 256 for x in range(16 * 16 * 3))
                    (root / split / cls / f"{i}.png").write_bytes(make_folder.png_bytes(16, 16, 3, pixels))
        bad = root / "test" / "b" / "1.png"
        data = bytearray(bad.read_bytes())
        idat = data.index(b"IDAT")
        data[idat + 4:idat + 12] = b"\xff" * 8
        bad.write_bytes(bytes(data))
        ck = self.dir / "run.ckpt"
        args = ["--data", "folder", "--data-dir", root, "--image-size", "16", "--batch", "8", "--epochs", "2",
                "--seed", "7", "--deterministic", "--save", ck]
        p = self.run_unchecked(*args, small=False)
        context = f"bin/{self.BINARY} {' '.join(map(str, args))}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, p.stdout + p.stderr, f"crash-like output\n{context}")
        self.assertEqual(p.returncode, 1, context)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, context)
        self.assertRegex(lines[0], rf"^error: {re.escape(str(bad))}: cannot decode the PNG .*; the state after step 5 is "
                                   rf"saved to {re.escape(str(ck))} \(fix or remove the file, then --resume ", context)
        self.assertEqual(self.checkpoint_header(ck)["step"], "5", context)
        bad.unlink()  # and the run goes on from there
        r = self.run_train(*args[:-2], "--resume", ck, small=False)
        self.assertRegex(r.stdout, rf"(?m)^resumed from {re.escape(str(ck))} at step 5 ", r.stdout)


    # ---- (f) --no-fuse: every pattern plain, or a warning where the build fuses nothing ----------

    def test_no_fuse_all_runs_every_conv_plain_or_warns_that_nothing_is_fused(self):
        # Not --deterministic (SMALL's): fusion is off under it whatever --no-fuse says.
        args = [a for a in SMALL if a != "--deterministic"] + [
            "--steps", "2", "--no-fuse", "all", "--autotune-cache", str(self.dir / "cache.txt")]
        p = self.run_unchecked(*args, small=False)
        fused_build = re.search(r"optimizations \[[^\]]*\bfusedbn\b", p.stdout) is not None
        if fused_build:
            self.check_output(args, p.returncode, p.stdout, p.stderr)
            self.assertRegex(p.stdout, r"(?m)^fused batch norm: 0 of \d+ conv patterns run fused")
            self.assertRegex(p.stdout, r"(?m)^  .* not fused for \d+ convs? \(.*\): switched off by --no-fuse$")
            self.assertNotRegex(p.stdout, r"measured slower|cuDNN has no engine")
        else:
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("warning: --no-fuse has no effect: this build does not fuse batch norm", p.stderr)
            self.assertNotIn("fused batch norm:", p.stdout)


class GraphRuns:
    """For builds that replay the step as a CUDA graph (a mixin after TrainingRuns)."""

    def setUp(self):
        super().setUp()
        build = subprocess.run([str(self.train), "--help"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if not re.search(r"optimizations \[[^\]]*\bcudagraph\b", build.stdout):
            self.skipTest(f"bin/{self.BINARY} is not built with CUDA graphs (OPT_CUDA_GRAPH=0)")

    def test_no_cuda_graph_gives_the_same_losses_and_test_results_bit_for_bit(self):
        # Two epochs of 10 steps with an evaluation after each: warm-up steps, the capture, replays,
        # an evaluation run eagerly between them and the capture after it, against every step eager.
        with_eval = [a for a in SMALL if a != "--no-eval"]
        runs = {}
        for name, extra in (("graph", []), ("eager", ["--no-cuda-graph"])):
            log = self.dir / f"{name}.log"
            args = [*with_eval, "--epochs", "2", "--loss-log", str(log), "--json", *extra]
            p = subprocess.run([str(self.train), *args], cwd=self.dir, capture_output=True, text=True,
                               timeout=RUN_TIMEOUT_S)
            self.check_output(args, p.returncode, p.stdout, p.stderr)
            epochs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"event":"epoch"')]
            self.assertEqual(len(epochs), 2, p.stdout)
            runs[name] = (p.stdout, self.loss_log(log, 0, 2 * STEPS_PER_EPOCH),
                          [(e["test_loss"], e["test_acc"]) for e in epochs])
        graph_out, eager_out = runs["graph"][0], runs["eager"][0]
        self.assertRegex(graph_out, r"(?m)^step graph: captured at step 2, [\d,]+ nodes \([\d,]+ memsets dropped: their bytes are zero; [\d,]+ zeroed at the start; [\d,]+ run as [\d,]+ kernels\), replayed from here on$")
        self.assertRegex(eager_out, r"(?m)^step: eager, .*\(--no-cuda-graph\)$")
        self.assertNotIn("step graph: captured", eager_out)
        self.assertEqual(runs["graph"][1], runs["eager"][1], "the graph changed the per-step losses (first: graph)")
        self.assertEqual(runs["graph"][2], runs["eager"][2], "the graph changed the test loss or accuracy")

    def test_accumulation_replays_a_graph_per_kind_of_micro_batch_bit_for_bit(self):
        # --accumulate 3: the first micro-batch (it records the loss), the middle one and the last (the
        # optimizer step) each have a graph of their own; 3 steps an epoch, 3 epochs with evaluations.
        with_eval = [a for a in SMALL if a != "--no-eval"]
        logs = {}
        for name, extra in (("graph", []), ("eager", ["--no-cuda-graph"])):
            log = self.dir / f"{name}.log"
            p = self.run_train(*with_eval, "--epochs", "3", "--accumulate", "3", "--loss-log", log, *extra, small=False)
            logs[name] = self.loss_log(log, 0, 9)
            if name == "graph":
                # each of the three graphs captured (later captures may update them without a line)
                self.assertGreaterEqual(len(re.findall(r"(?m)^step graph: captured at step 2,", p.stdout)), 3, p.stdout)
        self.assertEqual(logs["graph"], logs["eager"], "the graphs changed the per-step losses (first: graph)")


class Train(GraphRuns, TrainingRuns, unittest.TestCase):
    BINARY = "train"


class TrainBaseline(TrainingRuns, unittest.TestCase):
    BINARY = "train-baseline"


class TrainCudaGraph(GraphRuns, TrainingRuns, unittest.TestCase):
    BINARY = "train-cudagraph"


if __name__ == "__main__":
    unittest.main()
