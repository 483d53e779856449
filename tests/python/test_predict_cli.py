"""bin/predict's command line as a user meets it, without a GPU: --help (every flag with its default,
the build's rungs, for every rung built), usage errors (exit 2), and bad checkpoints, data and
output paths (exit 1), each reported as exactly one "error: ..." line on stderr, before the GPU is
looked for, and leaving no output file behind.

The runs hide the GPU (CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine with one: a
run with valid inputs gets as far as "no CUDA device", which is what proves that the errors of the
other runs came first.
"""

import json
import os
import re
import struct
import subprocess
import tempfile
import unittest
import zlib
from pathlib import Path

from tests.python import REPO
from tests.python.predict_samples import PREDICT, UNIT_TESTS, samples
from tests.python.cli_harness import CRASH_SIGNS, CliAssertions

FLAGS = ["--checkpoint", "--data", "--data-dir", "--synthetic-size", "--skip-bad-images", "--cache-decoded", "--split",
         "--batch", "--out", "--top-k", "--features", "--features-dtype", "--export", "--workers", "--deterministic",
         "--no-fuse", "--warmup-batches", "--trace", "--json", "--help"]
# The egress ladder, cumulative, as `make predict-variants` builds it.
RUNGS = {"predict-baseline": [], "predict-workers": ["workers"], "predict-pool": ["workers", "pool"],
         "predict-async": ["workers", "pool", "async"], "predict-stream": ["workers", "pool", "async", "stream"],
         "predict": ["workers", "pool", "async", "stream"]}
SYNTHETIC = ["--data", "synthetic", "--synthetic-size", "256", "--batch", "32"]


class PredictCliBase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-predict-cli-")
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_predict(self, *args, binary=PREDICT, hide_gpu=True):
        env = dict(os.environ)
        if hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        p = subprocess.run([str(binary), *args], cwd=self.dir, env=env, capture_output=True, text=True, timeout=300)
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, p.stdout + p.stderr, f"crash-like output from {args}")
        self.assertGreaterEqual(p.returncode, 0, f"killed by signal {-p.returncode}: {args}")
        return p

    assert_one_error_line = CliAssertions.assert_one_error_line  # the same contract as bin/train's

    def assert_no_outputs(self):
        outputs = (".csv", ".npy", ".png", ".json", ".safetensors")
        left = sorted(p.name for p in self.dir.iterdir() if p.suffix in outputs or ".tmp" in p.name)
        self.assertEqual(left, [], "a failed run must leave no output, not even a temporary file")


@unittest.skipUnless(PREDICT.exists(), f"{PREDICT} is not built (make bin/predict)")
class PredictHelpAndUsage(PredictCliBase):
    def test_help_lists_every_flag_with_its_default_and_the_rungs(self):
        p = self.run_predict("--help", hide_gpu=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        rows = [line for line in p.stdout.splitlines() if line.startswith("  --")]
        self.assertEqual({r.split()[0] for r in rows}, set(FLAGS))
        for row in rows:
            if not row.startswith("  --help"):
                self.assertIn("[default: ", row)
        self.assertIn("this build: predict: egress [workers pool async stream] -> ", p.stdout)
        self.assertRegex(p.stdout, r"network: (fp32|fp16), (NCHW|NHWC), ")

    def test_help_speaks_of_what_predict_has(self):
        # It spoke of bin/train's epochs and ranks (the shared data flags' help), and not of what
        # --export needs: the data set the checkpoint was trained on.
        help_text = self.run_predict("--help", hide_gpu=False).stdout
        for word in ("epoch", "rank", "torchrun", "--gpus", "per step"):
            self.assertNotIn(word, help_text)
        export = next(line for line in help_text.splitlines() if line.startswith("  --export"))
        self.assertIn("the data set the checkpoint was trained on must be there, named by --data and --data-dir", export)

    def test_every_rung_built_prints_its_rungs(self):
        built = [name for name in RUNGS if (REPO / "bin" / name).exists()]
        if len(built) < 2:
            self.skipTest("the rungs are not built (make predict-variants)")
        for name in built:
            with self.subTest(name):
                p = self.run_predict("--help", binary=REPO / "bin" / name, hide_gpu=False)
                self.assertEqual(p.returncode, 0, p.stderr)
                m = re.search(r"this build: (\S+): egress \[([a-z ]+|none: the baseline)\]", p.stdout)
                self.assertIsNotNone(m, p.stdout[-400:])
                self.assertEqual(m.group(1), name)
                self.assertEqual([] if m.group(2).startswith("none") else m.group(2).split(), RUNGS[name])
                # ... and at start, before anything can fail.
                start = self.run_predict("--checkpoint", "missing.ckpt", binary=REPO / "bin" / name)
                self.assertIn(f"{name}: egress [", start.stdout.splitlines()[0])

    def test_usage_errors_exit_2(self):
        cases = [([], "--checkpoint"),
                 (["--checkpoint", "m.ckpt", "--bach", "64"], "--bach"),
                 (["--checkpoint", "m.ckpt", "--split", "val"], "--split"),
                 (["--checkpoint", "m.ckpt", "--batch", "1"], "--batch"),
                 (["--checkpoint", "m.ckpt", "--top-k", "x"], "--top-k"),
                 (["--checkpoint", "m.ckpt", "--features-dtype", "float64", "--features", "f.npy"], "--features-dtype"),
                 (["--checkpoint", "m.ckpt", "--features-dtype", "float16"], "needs --features"),
                 (["--checkpoint", "m.ckpt", "--export", "m.safetensors", "--out", "p.csv"], "--export"),
                 (["--checkpoint", "m.ckpt", "--out", "same", "--features", "same"], "same file"),
                 (["--checkpoint", "m.ckpt", "--data"], "--data")]
        for args, part in cases:
            with self.subTest(args):
                self.assert_one_error_line(self.run_predict(*args), 2, part)
        self.assert_no_outputs()

    def test_usage_error_wins_over_bad_files(self):
        self.assert_one_error_line(self.run_predict("--checkpoint", "missing.ckpt", "--out", "/no/such/dir/p.csv",
                                                    "--top-k", "0"), 2, "--top-k")


@unittest.skipUnless(PREDICT.exists(), f"{PREDICT} is not built (make bin/predict)")
class PredictBadFiles(PredictCliBase):
    def test_missing_checkpoint_exits_1_naming_it(self):
        missing = self.dir / "missing.ckpt"
        line = self.assert_one_error_line(self.run_predict("--checkpoint", str(missing), *SYNTHETIC), 1, str(missing))
        self.assertNotIn("CUDA", line)
        self.assert_no_outputs()

    def test_corrupt_checkpoint_exits_1_naming_it(self):
        for name, content in [("bad.ckpt", b"RN50CKPT" + b"\x01\x00\x00\x00" + b"\xff" * 10),
                              ("empty.ckpt", b""), ("text.ckpt", b"not a checkpoint at all\n")]:
            with self.subTest(name):
                path = self.dir / name
                path.write_bytes(content)
                line = self.assert_one_error_line(self.run_predict("--checkpoint", str(path), *SYNTHETIC), 1, str(path))
                self.assertNotIn("CUDA", line)
        self.assert_no_outputs()

    def test_bad_output_paths_exit_1_before_anything_is_read(self):
        (self.dir / "adir").mkdir()
        # The checkpoint is missing too: the output path is checked first, before any work.
        for args, part in [(["--out", "/no/such/dir/p.csv"], "--out /no/such/dir/p.csv"),
                           (["--out", "adir"], "is a directory"),
                           (["--features", "adir"], "--features"),
                           (["--features", "nowhere/f.npy"], "does not exist"),
                           (["--trace", "nowhere/t.json"], "--trace"),
                           (["--export", "nowhere/m.safetensors"], "--export")]:
            with self.subTest(args):
                line = self.assert_one_error_line(self.run_predict("--checkpoint", "missing.ckpt", *args), 1, part)
                self.assertNotIn("missing.ckpt", line)
        self.assert_no_outputs()

    def test_read_only_directory_is_refused_up_front(self):
        if os.geteuid() != 0:
            ro, user = self.dir / "ro", None
        else:  # root writes anywhere: run as "nobody", who can reach the scratch directory
            os.chmod(self.dir, 0o755)
            ro, user = self.dir / "ro", 65534
        ro.mkdir()
        os.chmod(ro, 0o555)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        try:
            p = subprocess.run([str(PREDICT), "--checkpoint", "missing.ckpt", "--out", str(ro / "p.csv")], cwd=self.dir,
                               env=env, capture_output=True, text=True, timeout=60, user=user)
        except PermissionError:
            self.skipTest("cannot run as user nobody here")
        if "Permission denied" in p.stderr and "error:" not in p.stderr:
            self.skipTest(f"user nobody cannot run {PREDICT}")
        self.assert_one_error_line(p, 1, "--out", "cannot create files in")


@unittest.skipUnless(PREDICT.exists() and UNIT_TESTS.exists(), "bin/predict and bin/unit_tests are not both built")
class PredictWithASampleCheckpoint(PredictCliBase):
    """With a valid checkpoint of the real network (tests/support/sample_checkpoint.h)."""

    def setUp(self):
        super().setUp()
        self.ckpt = str(samples() / "sample.ckpt")  # trained on "synthetic", NHWC

    def test_valid_inputs_get_as_far_as_the_gpu_and_leave_nothing(self):
        p = self.run_predict("--checkpoint", self.ckpt, *SYNTHETIC, "--features", "f.npy", "--out", "p.csv")
        self.assert_one_error_line(p, 1, "no CUDA device")
        self.assertIn("checkpoint: ", p.stdout)
        self.assert_no_outputs()

    def test_checkpoint_of_another_data_set_exits_1(self):
        if not Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").exists() and \
                not os.environ.get("FASHION_MNIST_DIR"):
            self.skipTest("Fashion-MNIST is not installed")
        line = self.assert_one_error_line(self.run_predict("--checkpoint", self.ckpt, "--data", "fashion-mnist"), 1,
                                          self.ckpt, "trained on synthetic", "--data synthetic")
        self.assertNotIn("CUDA", line)

    def test_top_k_above_the_classes_exits_2(self):
        self.assert_one_error_line(self.run_predict("--checkpoint", self.ckpt, *SYNTHETIC, "--top-k", "11"), 2,
                                   "--top-k 11", "10 classes")
        self.assert_no_outputs()

    def test_bad_data_is_reported_before_the_gpu(self):
        missing = self.dir / "no-cifar"
        line = self.assert_one_error_line(self.run_predict("--checkpoint", self.ckpt, "--data", "cifar10",
                                                           "--data-dir", str(missing)), 1, str(missing))
        self.assertNotIn("CUDA", line)

    def test_export_needs_no_gpu(self):
        p = self.run_predict("--checkpoint", self.ckpt, *SYNTHETIC, "--export", "m.safetensors")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        self.assertIn("exported 320 tensors", p.stdout)
        # A model of synthetic data has no test set bench/load_safetensors.py could evaluate it on.
        self.assertIn("ResNet50Cifar(num_classes=10) takes its tensors as a state_dict", p.stdout)
        self.assertTrue((self.dir / "m.safetensors").is_file())
        self.assertEqual(list(self.dir.glob("m.safetensors.tmp*")), [])


@unittest.skipUnless(PREDICT.exists() and UNIT_TESTS.exists(), "bin/predict and bin/unit_tests are not both built")
class PredictOnAnImageFolder(PredictCliBase):
    """A checkpoint trained on an image folder at 64x64 (the sample checkpoint with its header saying so):
    bin/predict serves the folder at the checkpoint's side and refuses a folder of other classes."""

    CLASSES = [f"c{k}" for k in range(10)]

    def setUp(self):
        super().setUp()
        self.ckpt = self.dir / "folder.ckpt"
        self.ckpt.write_bytes(self.with_header(Path(samples() / "sample.ckpt").read_bytes(),
                                               {"data": "folder", "image_side": "64", "classes": ",".join(self.CLASSES)}))

    @staticmethod
    def with_header(ckpt: bytes, changes: dict) -> bytes:
        """A checkpoint with header keys set (include/train/checkpoint.h: magic, u32 version, u32 header
        length, header, arrays, CRC-32 of everything before it)."""
        (length,) = struct.unpack_from("<I", ckpt, 12)
        header = dict(line.split("=", 1) for line in ckpt[16:16 + length].decode().splitlines())
        header.update(changes)
        text = "".join(f"{k}={v}\n" for k, v in header.items()).encode()
        body = ckpt[:12] + struct.pack("<I", len(text)) + text + ckpt[16 + length:-4]
        return body + struct.pack("<I", zlib.crc32(body))

    def write_folder(self, classes):
        fixture = (REPO / "tests" / "fixtures" / "images" / "rgb.png").read_bytes()
        root = self.dir / "images"
        for split in ("train", "test"):
            for cls in classes:
                (root / split / cls).mkdir(parents=True, exist_ok=True)
                (root / split / cls / "x.png").write_bytes(fixture)
        return root

    def test_the_folder_is_served_at_the_checkpoints_image_side(self):
        root = self.write_folder(self.CLASSES)
        p = self.run_predict("--checkpoint", str(self.ckpt), "--data", "folder", "--data-dir", str(root), "--batch", "4",
                             "--export", "m.safetensors")
        self.assertEqual(p.returncode, 0, p.stderr)
        data = (self.dir / "m.safetensors").read_bytes()
        (length,) = struct.unpack_from("<Q", data, 0)
        meta = json.loads(data[8:8 + length])["__metadata__"]
        self.assertEqual(meta["input_side"], "64")
        self.assertEqual(meta["data"], "folder")
        self.assertEqual(json.loads(meta["class_names"]), self.CLASSES)

    def test_one_class_of_its_own_is_named_on_each_side(self):
        # The first classes agree: "(the checkpoint's first: c0; the data set's: c0)" named no difference.
        root = self.write_folder(self.CLASSES[:9] + ["x"])
        self.assert_one_error_line(self.run_predict("--checkpoint", str(self.ckpt), "--data", "folder", "--data-dir",
                                                    str(root), "--batch", "4", "--export", "m.safetensors"), 1,
                                   f"{self.ckpt}: trained on other classes than those of {root} (10 in the "
                                   "checkpoint, 10 in the data set): only in the checkpoint: c9; only in the data set: x")
        self.assert_no_outputs()

    def test_another_model_signature_shows_both(self):
        # The same model name and parameter count on both sides: the message read alike.
        self.ckpt.write_bytes(self.with_header(self.ckpt.read_bytes(), {"model_signature": "12345"}))
        line = self.assert_one_error_line(self.run_predict("--checkpoint", str(self.ckpt), "--data", "folder",
                                                           "--data-dir", str(self.write_folder(self.CLASSES)),
                                                           "--batch", "4", "--export", "m.safetensors"), 1,
                                          "other tensor names or shapes (model signature 12345 in the checkpoint, ")
        self.assertRegex(line, r"in the checkpoint, \d+ here\)")
        self.assert_no_outputs()

    def test_a_checkpoint_of_other_data_says_what_data_gave(self):
        # "trained on synthetic, but --data folder chose folder": what the flag gave, and where.
        root = self.write_folder(self.CLASSES)
        self.assert_one_error_line(self.run_predict("--checkpoint", str(samples() / "sample.ckpt"), "--data", "folder",
                                                    "--data-dir", str(root), "--batch", "4", "--export",
                                                    "m.safetensors"), 1,
                                   f"trained on synthetic, but --data folder gave an image folder ({root}): pass "
                                   "--data synthetic")

    def test_a_folder_of_other_classes_exits_1(self):
        root = self.write_folder([f"d{k}" for k in range(10)])
        line = self.assert_one_error_line(self.run_predict("--checkpoint", str(self.ckpt), "--data", "folder",
                                                           "--data-dir", str(root), "--batch", "4", "--export",
                                                           "m.safetensors"), 1,
                                          str(self.ckpt), "trained on other classes", "c0", "d0")
        self.assertNotIn("CUDA", line)
        self.assert_no_outputs()


if __name__ == "__main__":
    unittest.main()
