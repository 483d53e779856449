"""bin/train's data errors: CIFAR-10 files, image folders (--data folder), --data auto with a --data-dir
that is not a data set, readers' sizes and host memory, and the data of the program's repository found
from another directory; each exit 1 with one "error: ..." line, before the GPU is looked for."""

import time
import unittest

from tests.python import REPO
from tests.python.cli_harness import TRAIN, TrainCliHarness


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(TrainCliHarness, unittest.TestCase):
    # ---- CIFAR-10 files --------------------------------------------------------------------------

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

    # ---- sizes from the file system, host memory -------------------------------------------------

    def test_a_huge_cifar_file_is_too_large_at_once(self):
        data = self.write_cifar()
        with open(data / "data_batch_1.bin", "r+b") as f:
            f.truncate(40 << 30)  # 40 GiB, sparse
        start = time.monotonic()
        p = self.run_train("--data", "cifar10", "--data-dir", str(data))
        self.assert_one_error_line(p, 1, str(data / "data_batch_1.bin"), "too large: 42949672960 bytes")
        self.assertLess(time.monotonic() - start, 30)

    def test_synthetic_data_larger_than_host_memory_says_how_much_it_needs(self):
        need = (10000000 + 2000000) * 3073
        available = mem_available()
        if available is None or available >= need:
            self.skipTest(f"this machine has {available} bytes available, enough for {need}")
        p = self.run_train("--data", "synthetic", "--synthetic-size", "10000000")
        self.assert_one_error_line(p, 1, "--synthetic-size 10000000 (12,000,000 generated images) needs 34.34 GiB "
                                   "of host memory, but only")

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

    # ---- run from another directory: the program's repository holds the data ---------------------

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


if __name__ == "__main__":
    unittest.main()
