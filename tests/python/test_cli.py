"""bin/train's command line as a user meets it: --help, usage errors (exit 2), and input errors
(exit 1), each reported as exactly one "error: ..." line on stderr, never a crash.

The runs that need no GPU hide it (CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine
with one: the data and checkpoint errors must come out before the GPU is looked for, which is what
tells a user with a broken data set about the data set, not about the GPU.
"""

import ctypes
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import zlib
from pathlib import Path

from tests.python import REPO

TRAIN = REPO / "bin" / "train"
CIFAR_FILES = ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
               "data_batch_5.bin", "test_batch.bin"]
CIFAR_FILE_BYTES = 10000 * 3073

FLAGS = ["--data", "--data-dir", "--synthetic-size", "--image-size", "--skip-bad-images", "--cache-decoded",
         "--epochs", "--steps", "--batch", "--lr", "--min-lr", "--warmup-epochs", "--no-lr-scaling", "--warmup-cap",
         "--momentum", "--wd", "--no-nesterov", "--seed", "--no-eval", "--label-smoothing", "--ema", "--tta-flip",
         "--workers", "--workspace-mb", "--autotune-cache", "--no-tf32", "--deterministic",
         "--no-fuse", "--no-cuda-graph", "--loss-scale", "--loss-scale-window", "--warmup-steps", "--profile-steps", "--trace",
         "--progress-every", "--json", "--loss-log", "--sample-png", "--save", "--save-every", "--resume", "--gpus",
         "--bucket-mb", "--last-bucket-mb", "--allreduce-dtype", "--grad-compression", "--accumulate",
         "--dist-timeout", "--help"]

# What a crash or an unhandled exception would leave in the output.
CRASH_SIGNS = ["Traceback", "Segmentation fault", "core dumped", "Aborted", "terminate called",
               "what():", "AddressSanitizer", "double free"]


class CliAssertions:
    """What the command-line tests of every program check of a finished process."""

    def assert_no_crash(self, p, args):
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, p.stdout + p.stderr, f"crash-like output from {args}")
        self.assertGreaterEqual(p.returncode, 0, f"killed by signal {-p.returncode}: {args}")

    def assert_one_error_line(self, p, code, *parts):
        self.assertEqual(p.returncode, code, f"stderr: {p.stderr!r}")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"expected one line on stderr, got {lines!r}")
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        for part in parts:
            self.assertIn(part, lines[0])
        return lines[0]


SYNTHETIC = ["--data", "synthetic", "--synthetic-size", "256", "--batch", "32"]


def nvidia_driver_installed():
    """What bin/train looks for: the kernel module's /proc entry, or a loadable libcuda."""
    if os.path.exists("/proc/driver/nvidia"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(CliAssertions, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-cli-")
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_train(self, *args, hide_gpu=True, timeout=300, program=TRAIN, cwd=None):
        env = dict(os.environ)
        if hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # In a scratch directory, so nothing (an autotune cache, a checkpoint) lands in the repository.
        p = subprocess.run([str(program), *args], cwd=cwd or self.dir, env=env, capture_output=True, text=True,
                           timeout=timeout)
        self.assert_no_crash(p, args)
        self.assertFalse(any(self.dir.glob("core*")), "a core file was written")
        return p

    def fake_repository(self):
        """bin/train in a repository of its own (bin/, a Makefile), as in a clone elsewhere; its root."""
        repo = self.dir / "repo"
        (repo / "bin").mkdir(parents=True)
        (repo / "Makefile").write_text("")
        copy_program(TRAIN, repo / "bin" / "train")
        return repo

    # ---- help and usage errors -----------------------------------------------------------------

    def test_help_lists_every_flag_and_the_builds_optimizations(self):
        p = self.run_train("--help", hide_gpu=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        listed = {line.split()[0] for line in p.stdout.splitlines() if line.startswith("  --")}
        self.assertEqual(listed, set(FLAGS))
        self.assertRegex(p.stdout, r"this build: \S+: optimizations \[[a-z0-9 :-]+\] -> (fp32|fp16), (NCHW|NHWC)")

    def test_unknown_flag_exits_2(self):
        self.assert_one_error_line(self.run_train("--bach", "64"), 2, "--bach")

    def test_missing_value_exits_2(self):
        self.assert_one_error_line(self.run_train("--data", "synthetic", "--batch"), 2, "--batch")

    def test_out_of_range_value_exits_2(self):
        self.assert_one_error_line(self.run_train("--batch", "1"), 2, "--batch", "out of range")
        self.assert_one_error_line(self.run_train("--lr=-1"), 2, "--lr")

    def test_non_number_exits_2(self):
        self.assert_one_error_line(self.run_train("--epochs", "ten"), 2, "--epochs")

    def test_usage_error_wins_over_everything_else(self):
        # A bad flag is reported before any data is read or any GPU is looked for.
        self.assert_one_error_line(
            self.run_train("--data", "cifar10", "--data-dir", str(self.dir / "nowhere"), "--momentum", "2"),
            2, "--momentum")

    # ---- input errors --------------------------------------------------------------------------

    def test_no_gpu_exits_1_with_one_line(self):
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32")
        self.assert_one_error_line(p, 1, "no CUDA device")

    def write_cifar(self, truncate=None, data=None):
        """Six CIFAR-10 batch files of zeros (label 0, black images: valid) in `data` (default: cifar/ of
        the scratch directory); `truncate` loses 1000 bytes."""
        data = data or self.dir / "cifar"
        data.mkdir(parents=True)
        for name in CIFAR_FILES:
            with open(data / name, "wb") as f:
                f.truncate(CIFAR_FILE_BYTES - (1000 if name == truncate else 0))  # sparse, instant
        return data

    def test_truncated_cifar_file_is_reported_before_the_gpu(self):
        data = self.write_cifar(truncate="data_batch_3.bin")
        p = self.run_train("--data", "cifar10", "--data-dir", str(data))
        line = self.assert_one_error_line(p, 1, str(data / "data_batch_3.bin"), "truncated")
        self.assertNotIn("CUDA", line)

    def test_valid_cifar_gets_as_far_as_the_gpu(self):
        # The same set-up without the damage passes data validation: the error is the GPU's. This is
        # what makes the test above prove the order rather than a data error that always comes first.
        # Its images are black: the normalisation's one warning line says so first (issue 38).
        data = self.write_cifar()
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--batch", "32")
        self.assertEqual(p.returncode, 1, p.stderr)
        warning, error = p.stderr.splitlines()
        self.assertEqual(warning, "warning: normalisation: every pixel of the 50,000 training images has the same "
                                  "value in channel red (0/255), green (0/255), blue (0/255): a standard deviation "
                                  "of 0, taken as 1 (are the images blank or of one colour?)")
        self.assertTrue(error.startswith("error: no CUDA device"), error)

    def test_missing_cifar_directory_exits_1(self):
        missing = self.dir / "no-such-dir"
        self.assert_one_error_line(self.run_train("--data", "cifar10", "--data-dir", str(missing)), 1, str(missing))

    # ---- image folders (--data folder) ---------------------------------------------------------

    def write_folder(self, truncate=None):
        """train/ and test/ with classes cat and dog, three fixture images each; `truncate` (a name under
        train/) loses its last 20 bytes."""
        fixtures = REPO / "tests" / "fixtures" / "images"
        root = self.dir / "images"
        for split in ("train", "test"):
            for cls in ("cat", "dog"):
                (root / split / cls).mkdir(parents=True)
                for name in ("rgb.png", "rgb.jpg", "grey.pgm"):
                    (root / split / cls / name).write_bytes((fixtures / name).read_bytes())
        if truncate:
            path = root / "train" / truncate
            path.write_bytes(path.read_bytes()[:-20])
        return root

    def test_folder_stops_at_the_gpu_before_decoding_any_image(self):
        # Decoding a large folder into memory, or its normalisation sample, takes minutes: the GPU is
        # looked for first. (Its files' headers are checked before: the tests below.)
        root = self.write_folder()
        for extra in ([], ["--cache-decoded"]):
            with self.subTest(extra=extra):
                p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2", "--image-size", "64",
                                   *extra)
                self.assert_one_error_line(p, 1, "no CUDA device")
                self.assertNotIn("cache: decoded", p.stdout)
                self.assertNotIn("normalisation:", p.stdout)

    def test_truncated_png_in_a_folder_is_one_line_naming_it_before_the_gpu(self):
        root = self.write_folder(truncate="dog/rgb.png")
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2")
        line = self.assert_one_error_line(p, 1, str(root / "train" / "dog" / "rgb.png"), "truncated")
        self.assertNotIn("CUDA", line)
        self.assertNotIn("data: folder", p.stdout)

    def test_skip_bad_images_looks_for_the_gpu_before_decoding_every_file(self):
        # --skip-bad-images decodes every file at start to find those that do not decode (issue 38):
        # long work, done only once the GPU is there. Which files it leaves out, and its warning, are
        # tested on the reader (ImageFolder.SkipBadImages* in tests/data/test_image_folder_bad_files.cpp).
        root = self.write_folder(truncate="dog/rgb.png")
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2", "--skip-bad-images")
        self.assert_one_error_line(p, 1, "no CUDA device")
        self.assertNotIn("decoded", p.stdout)

    def test_folder_without_data_dir_exits_2(self):
        self.assert_one_error_line(self.run_train("--data", "folder"), 2, "--data-dir")

    def test_missing_folder_exits_1_naming_it(self):
        missing = self.dir / "no-such-folder"
        self.assert_one_error_line(self.run_train("--data", "folder", "--data-dir", str(missing)), 1, str(missing))

    def test_missing_resume_file_exits_1_naming_it(self):
        missing = self.dir / "missing.ckpt"
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(missing))
        line = self.assert_one_error_line(p, 1, str(missing))
        self.assertNotIn("CUDA", line)

    def test_corrupt_resume_file_exits_1_naming_it(self):
        bad = self.dir / "bad.ckpt"
        bad.write_bytes(b"RN50CKPT" + b"\x01\x00\x00\x00" + b"\xff" * 10)
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(bad))
        line = self.assert_one_error_line(p, 1, str(bad))
        self.assertNotIn("CUDA", line)


    # ---- output paths: checked before the data is loaded and before the GPU -----------------------

    def test_save_into_a_missing_directory_is_refused_at_start(self):
        p = self.run_train("--save", "/no/such/dir/x.ckpt")
        line = self.assert_one_error_line(p, 1)
        self.assertEqual(line, "error: --save /no/such/dir/x.ckpt: the directory /no/such/dir does not exist")

    def test_output_paths_are_checked_before_the_data(self):
        # A broken data set would be reported first if the paths were checked after loading it.
        data = self.write_cifar(truncate="data_batch_1.bin")
        for flag in ("--save", "--loss-log", "--sample-png", "--trace", "--autotune-cache"):
            with self.subTest(flag=flag):
                bad = str(self.dir / "missing" / "out.file")
                p = self.run_train("--data", "cifar10", "--data-dir", str(data), flag, bad)
                self.assert_one_error_line(p, 1, f"{flag} {bad}: the directory {self.dir / 'missing'} does not exist")

    def test_two_flags_naming_one_file_are_a_usage_error_before_the_data(self):
        # bin/train writes its autotune cache (autotune-cache.txt of the repository unless
        # --autotune-cache says where).
        data = self.write_cifar(truncate="data_batch_1.bin")
        cache = REPO / "autotune-cache.txt"
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--save", str(cache))
        self.assert_one_error_line(p, 2, f"--save and --autotune-cache name the same file, {cache}")
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--resume", "r.ckpt", "--loss-log", "./r.ckpt")
        self.assert_one_error_line(p, 2, "--resume and --loss-log name the same file, ./r.ckpt")

    def test_an_unwritable_directory_or_a_directory_as_file_is_refused(self):
        # /proc takes no new files, whoever asks (root included).
        self.assert_one_error_line(self.run_train("--loss-log", "/proc/loss.txt"), 1,
                                   "--loss-log /proc/loss.txt: cannot create files in the directory /proc")
        self.assert_one_error_line(self.run_train("--save", str(self.dir)), 1, "--save", "is a directory")

    # ---- readers: sizes from the file system, regular files only, host memory --------------------

    def test_a_huge_cifar_file_is_too_large_at_once(self):
        data = self.write_cifar()
        with open(data / "data_batch_1.bin", "r+b") as f:
            f.truncate(40 << 30)  # 40 GiB, sparse
        start = time.monotonic()
        p = self.run_train("--data", "cifar10", "--data-dir", str(data))
        self.assert_one_error_line(p, 1, str(data / "data_batch_1.bin"), "too large: 42949672960 bytes")
        self.assertLess(time.monotonic() - start, 30)

    def test_a_huge_resume_file_is_too_large_at_once(self):
        for size in (12 << 30, 40 << 30):
            huge = self.dir / "huge.ckpt"
            with open(huge, "wb") as f:
                f.write(b"RN50CKPT")
                f.truncate(size)
            p = self.run_train(*SYNTHETIC, "--resume", str(huge))
            self.assert_one_error_line(p, 1, f"{huge}: too large: {size} bytes")

    def test_a_fifo_given_to_resume_is_refused_not_waited_on(self):
        fifo = self.dir / "resume.ckpt"
        os.mkfifo(fifo)
        p = self.run_train(*SYNTHETIC, "--resume", str(fifo), timeout=60)
        self.assert_one_error_line(p, 1, f"{fifo}: is a FIFO (named pipe), expected a regular file")

    def test_synthetic_data_larger_than_host_memory_says_how_much_it_needs(self):
        need = (10000000 + 2000000) * 3073
        available = mem_available()
        if available is None or available >= need:
            self.skipTest(f"this machine has {available} bytes available, enough for {need}")
        p = self.run_train("--data", "synthetic", "--synthetic-size", "10000000")
        self.assert_one_error_line(p, 1, "--synthetic-size 10000000 (12,000,000 generated images) needs 34.34 GiB "
                                   "of host memory, but only")

    # ---- no driver -------------------------------------------------------------------------------

    @unittest.skipIf(nvidia_driver_installed(), "this machine has an NVIDIA driver")
    def test_no_driver_says_so_and_points_at_make_test(self):
        p = self.run_train(*SYNTHETIC, hide_gpu=False)
        line = self.assert_one_error_line(p, 1, "no CUDA device: no NVIDIA driver or GPU was found", "`make test`")
        self.assertNotIn("insufficient", line)

    # ---- checkpoints: compatibility and damage, all before the GPU -------------------------------

    def resume(self, path, *extra):
        return self.run_train(*SYNTHETIC, *extra, "--resume", str(path))

    def test_a_checkpoint_of_another_model_is_refused_before_the_gpu(self):
        small = write_checkpoint(self.dir / "other.ckpt", header(params=3, running=2, signature=42), 3, 2)
        self.assert_one_error_line(self.resume(small), 1, "checkpoint of another model")

    def test_another_precision_batch_data_or_data_size_is_refused_before_the_gpu(self):
        precision, layout = this_build()
        other = {"fp32": "fp16", "fp16": "fp32"}[precision]
        ckpt = self.dir / "run.ckpt"
        params, running, signature = resnet50_params()
        fits = dict(params=params, running=running, signature=signature, precision=precision, layout=layout,
                    data="synthetic", batch=32)
        cases = [
            (dict(fits, precision=other), f"written by a {other}/{layout} build"),
            (dict(fits, batch=64), "trained with --batch 64"),
            (dict(fits, data="cifar10"), "trained on cifar10; resume with --data cifar10"),
            # step 100 = epoch 1 x 95 + 5: a run of 95 steps per epoch, but 256 images / 32 give 8
            (dict(fits, step=100, epoch=1, step_in_epoch=5), "does not fit this run's 8 steps per epoch"),
        ]
        for fields, expected in cases:
            with self.subTest(expected=expected):
                write_checkpoint(ckpt, header(**fields), params, running)
                line = self.assert_one_error_line(self.resume(ckpt), 1, str(ckpt), expected)
                self.assertNotIn("CUDA", line)
        # The same file, fitting, gets as far as the GPU: the checks above are what refused it.
        write_checkpoint(ckpt, header(**fits), params, running)
        self.assert_one_error_line(self.resume(ckpt), 1, "no CUDA device")

    def test_a_corrupt_header_is_told_from_a_truncated_file(self):
        bad = write_checkpoint(self.dir / "bad.ckpt", header(params=13759268650546400843, running=2), 3, 2)
        line = self.assert_one_error_line(self.resume(bad), 1, f"{bad}: corrupt header")
        self.assertNotIn("truncated", line)
        cut = write_checkpoint(self.dir / "cut.ckpt", header(params=1000, running=20), 1000, 20)
        with open(cut, "r+b") as f:
            f.truncate(os.path.getsize(cut) - 100)
        self.assert_one_error_line(self.resume(cut), 1, f"{cut}: truncated")

    def test_step_epoch_and_step_in_epoch_are_checked_against_each_other(self):
        bad = write_checkpoint(self.dir / "pos.ckpt", header(params=3, running=2, step=100, epoch=3, step_in_epoch=5),
                               3, 2)
        self.assert_one_error_line(self.resume(bad), 1, f"{bad}: inconsistent header: step 100 is not epoch 3")

    # ---- --data auto with a --data-dir that is not a data set --------------------------------------

    def test_auto_with_a_mistyped_data_dir_says_it_does_not_exist(self):
        typo = self.dir / "cifar-10-batchs-bin"
        line = self.assert_one_error_line(self.run_train("--data-dir", str(typo)), 1,
                                          f"--data-dir {typo}: the directory does not exist")
        self.assertNotIn("Fashion-MNIST", line)

    def test_auto_with_a_directory_of_neither_says_what_it_looked_for(self):
        line = self.assert_one_error_line(self.run_train("--data-dir", str(self.dir)), 1,
                                          "holds neither CIFAR-10 (data_batch_1.bin) nor Fashion-MNIST",
                                          "--data folder with a folder of images")
        self.assertNotIn("install", line)

    def test_auto_with_an_image_folder_says_to_add_data_folder(self):
        # A newcomer's first try with their own images: --data-dir alone.
        root = self.write_folder()
        self.assert_one_error_line(self.run_train("--data-dir", str(root)), 1,
                                   f"--data-dir {root}: holds neither CIFAR-10",
                                   "but a train/ directory: for a folder of your images (train/<class>/<images>), "
                                   "add --data folder")

    # ---- run from another directory: the program's repository holds the data and the cache -------

    def test_from_another_directory_the_data_of_the_programs_repository_is_found(self):
        repo = self.fake_repository()
        self.write_cifar(data=repo / "data" / "cifar-10-batches-bin")
        elsewhere = self.dir / "elsewhere"
        elsewhere.mkdir()
        p = self.run_train("--batch", "32", program=repo / "bin" / "train", cwd=elsewhere)
        self.assertEqual(p.returncode, 1, p.stderr)
        warning, error = p.stderr.splitlines()  # its images are black: the normalisation says so first
        self.assertTrue(warning.startswith("warning: normalisation: every pixel of the 50,000 training images"), warning)
        self.assertTrue(error.startswith("error: no CUDA device"), error)
        self.assertIn(f"data: cifar10 from {repo}/data/cifar-10-batches-bin: 50000 train, 10000 test images", p.stdout)

    def test_from_another_directory_the_autotune_cache_is_the_programs_repositorys(self):
        repo = self.fake_repository()
        elsewhere = self.dir / "elsewhere"
        elsewhere.mkdir()
        help_text = self.run_train("--help", program=repo / "bin" / "train", cwd=elsewhere).stdout
        self.assertIn(f"[default: {repo}/autotune-cache.txt]", help_text)
        if not re.search(r"optimizations \[[^\]]*\bautotune\b", help_text):
            self.skipTest("bin/train is not an autotuning build: it writes no autotune cache")
        data = self.write_cifar(truncate="data_batch_1.bin")
        p = self.run_train("--data-dir", str(data), "--save", str(repo / "autotune-cache.txt"),
                           program=repo / "bin" / "train", cwd=elsewhere)
        self.assert_one_error_line(p, 2, f"--save and --autotune-cache name the same file, {repo}/autotune-cache.txt")

    def test_an_unwritable_default_autotune_cache_is_a_warning_not_an_error(self):
        # A program outside a repository keeps its cache in the working directory; /proc takes no
        # new files, whoever asks. A --autotune-cache the user names must still be writable (above).
        if not re.search(r"optimizations \[[^\]]*\bautotune\b", self.run_train("--help").stdout):
            self.skipTest("bin/train is not an autotuning build: it writes no autotune cache")
        alone = self.dir / "alone"
        alone.mkdir()
        copy_program(TRAIN, alone / "train")
        p = self.run_train(*SYNTHETIC, program=alone / "train", cwd="/proc")
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertRegex(lines[0], r"^warning: --autotune-cache autotune-cache.txt: cannot create files in the "
                                   r"directory \.: .*; training without saving the measured algorithms ")
        self.assertIn("no CUDA device", lines[1])

    # ---- flags -----------------------------------------------------------------------------------

    def test_an_empty_value_is_a_usage_error(self):
        for flag, value_name in (("--data-dir", "DIR"), ("--resume", "FILE"), ("--trace", "FILE")):
            with self.subTest(flag=flag):
                self.assert_one_error_line(self.run_train(flag, ""), 2,
                                           f"{flag} needs a value ({value_name}), not an empty string")

    def test_dash_h_is_help(self):
        self.assertEqual(self.run_train("-h").stdout, self.run_train("--help").stdout)
        self.assertEqual(self.run_train("-h").returncode, 0)

    def test_a_repeated_flag_is_a_usage_error(self):
        self.assert_one_error_line(self.run_train("--batch", "64", "--epochs", "2", "--batch", "32"), 2,
                                   "--batch is given twice")

    def test_a_flag_where_a_value_should_be_is_named(self):
        line = self.assert_one_error_line(self.run_train("--data-dir", "--epochs", "3"), 2)
        self.assertEqual(line, "error: --data-dir needs a value (DIR), not the flag --epochs")

    def test_a_twenty_digit_integer_is_out_of_range(self):
        self.assert_one_error_line(self.run_train("--seed", "12345678901234567890"), 2, "--seed", "out of range [0, ")




def copy_program(program, to):
    """A hard link where the file system allows one (instant), else a copy."""
    try:
        os.link(program, to)
    except OSError:
        shutil.copy2(program, to)


def mem_available():
    """MemAvailable of /proc/meminfo in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def this_build():
    """(precision, layout) of bin/train, from its --help."""
    out = subprocess.run([str(TRAIN), "--help"], capture_output=True, text=True).stdout
    m = re.search(r"-> (fp32|fp16), (NCHW|NHWC)", out)
    return m.group(1), m.group(2)


# The checkpoint format of include/train/checkpoint.h, written independently, and the model signature
# of src/train/checkpoint.cpp (model_signature) over ResNet-50's parameters, so that a test can make a
# checkpoint that fits this trainer's model and differs in one thing only.
MASK = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _mix(a, b):
    return _splitmix64(a ^ _splitmix64((b + 0x632BE59BD9B4E019) & MASK))


def resnet50_params(classes=10):
    """(parameter count, BN running statistics count, model signature) of ResNet-50 (CIFAR stem)."""
    tensors = [("conv1.weight", [64, 3, 3, 3]), ("bn1.weight", [64]), ("bn1.bias", [64])]
    in_c = 64
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for i in range(blocks):
            p, out_c = f"layer{stage + 1}.{i}.", width * 4
            for conv, shape, bn, channels in (("conv1", [width, in_c, 1, 1], "bn1", width),
                                              ("conv2", [width, width, 3, 3], "bn2", width),
                                              ("conv3", [out_c, width, 1, 1], "bn3", out_c)):
                tensors += [(p + conv + ".weight", shape), (p + bn + ".weight", [channels]), (p + bn + ".bias", [channels])]
            if i == 0:
                tensors += [(p + "downsample.0.weight", [out_c, in_c, 1, 1]), (p + "downsample.1.weight", [out_c]),
                            (p + "downsample.1.bias", [out_c])]
            in_c = out_c
    tensors += [("fc.weight", [classes, in_c]), ("fc.bias", [classes])]
    h, params, running = 0x5EED, 0, 0
    for name, shape in tensors:
        for ch in name.encode():
            h = _mix(h, ch)
        for d in shape:
            h = _mix(h, d + 0x100)
        params += math.prod(shape)
        if name.endswith(".bias") and not name.startswith("fc"):
            running += 2 * shape[0]
    return params, running, h


def header(params, running, signature=0, precision="fp32", layout="NCHW", data="synthetic", batch=32, step=0,
           epoch=0, step_in_epoch=0):
    return (f"precision={precision}\nlayout={layout}\nmodel=resnet50-cifar\nmodel_signature={signature}\n"
            f"params={params}\nrunning={running}\ndata={data}\nbatch={batch}\nepochs=15\nseed=0\nstep={step}\n"
            f"epoch={epoch}\nstep_in_epoch={step_in_epoch}\nloss_scale=0x1p+0\ngood_steps=0\nskipped_steps=0\n")


def write_checkpoint(path, header_text, params, running):
    """A checkpoint of zero-valued arrays: magic, version 1, header, three length-prefixed float32
    arrays, CRC-32 of everything before it."""
    head = header_text.encode()
    crc = 0
    with open(path, "wb") as f:
        def put(chunk):
            nonlocal crc
            crc = zlib.crc32(chunk, crc)
            f.write(chunk)
        put(b"RN50CKPT" + struct.pack("<II", 1, len(head)) + head)
        zeros = bytes(1 << 22)
        for count in (params, params, running):
            put(struct.pack("<Q", count))
            left = 4 * count
            while left:
                put(zeros[:min(left, len(zeros))])
                left -= min(left, len(zeros))
        f.write(struct.pack("<I", crc))
    return path


if __name__ == "__main__":
    unittest.main()
