"""bench/load_safetensors.py on damaged files: every bad file is refused with one line,
`load_safetensors: error: <file>: <problem>`, and exit status 1, never a traceback, and a truncated
export is refused naming a tensor instead of read with short tensors. No PyTorch needed: the file is
read and checked before torch is imported.

    python3 -m unittest tests.python.test_load_safetensors_files
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from tests.python import BENCH, REPO
from tests.python.test_data_scripts import write_fashion_mnist

import load_safetensors  # bench/, on sys.path through tests/python/__init__.py

SCRIPT = BENCH / "load_safetensors.py"
META = {"classes": "10", "data": "synthetic", "input_mean": "[0.5,0.5,0.5]", "input_std": "[0.25,0.25,0.25]"}
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def safetensors_bytes(header, body: bytes = b"", raw_header: bytes | None = None) -> bytes:
    """8-byte little-endian header length, the JSON header (padded with spaces to 8 bytes), the body."""
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + body


def good_file() -> bytes:
    w = struct.pack("<6f", *[k + 0.5 for k in range(6)])
    h = struct.pack("<2e", 1.0, -2.0)
    steps = struct.pack("<q", 7)
    header = {"__metadata__": META,
              "conv1.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "half": {"dtype": "F16", "shape": [2], "data_offsets": [24, 28]},
              "bn1.num_batches_tracked": {"dtype": "I64", "shape": [], "data_offsets": [32, 40]},
              "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [40, 40]}}
    return safetensors_bytes(header, w + h + b"\0" * 4 + steps)


def entry(**changes):
    e = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    e.update(changes)
    return {k: v for k, v in e.items() if v is not None}


# name -> (file bytes, a piece of the problem the line must name)
BAD = {
    "empty": (b"", "too short"),
    "five-bytes": (b"\x01\x02\x03\x04\x05", "too short"),
    "cut-in-header": (good_file()[:20], "runs past the end of the file"),
    "garbage-header": (safetensors_bytes(None, raw_header=b"this is not json"), "not valid JSON"),
    "non-utf8-header": (safetensors_bytes(None, raw_header=b'{"a\xff\xfe": 1}'), "not UTF-8"),
    "list-header": (safetensors_bytes([1, 2, 3]), "header is a JSON list, not an object"),
    "number-header": (safetensors_bytes(5), "header is a JSON int, not an object"),
    "entry-not-object": (safetensors_bytes({"w": [0, 8]}, b"\0" * 8), "tensor 'w': entry is not a JSON object"),
    "no-data-offsets": (safetensors_bytes({"w": entry(data_offsets=None)}, b"\0" * 8), "tensor 'w': no data_offsets"),
    "no-dtype": (safetensors_bytes({"w": entry(dtype=None)}, b"\0" * 8), "tensor 'w': no dtype"),
    "no-shape": (safetensors_bytes({"w": entry(shape=None)}, b"\0" * 8), "tensor 'w': no shape"),
    "unknown-dtype": (safetensors_bytes({"w": entry(dtype="Q7")}, b"\0" * 8), "unknown dtype 'Q7'"),
    "dtype-not-string": (safetensors_bytes({"w": entry(dtype=4)}, b"\0" * 8), "dtype 4 is not a string"),
    "shape-not-list": (safetensors_bytes({"w": entry(shape="2")}, b"\0" * 8), "shape '2' is not a list"),
    "negative-dim": (safetensors_bytes({"w": entry(shape=[-2])}, b"\0" * 8), "shape [-2] is not a list"),
    "float-dim": (safetensors_bytes({"w": entry(shape=[2.0])}, b"\0" * 8), "shape [2.0] is not a list"),
    "offsets-three": (safetensors_bytes({"w": entry(data_offsets=[0, 4, 8])}, b"\0" * 8),
                      "data_offsets [0, 4, 8] is not two"),
    "offsets-strings": (safetensors_bytes({"w": entry(data_offsets=["0", "8"])}, b"\0" * 8),
                        "is not two non-negative integers"),
    "offsets-reversed": (safetensors_bytes({"w": entry(data_offsets=[8, 0])}, b"\0" * 8), "end before they begin"),
    "offsets-past-body": (safetensors_bytes({"w": entry(data_offsets=[0, 8])}, b"\0" * 4),
                          "tensor 'w': data_offsets [0, 8] run past the end of the data (4 bytes)"),
    "wrong-size": (safetensors_bytes({"w": entry(shape=[3])}, b"\0" * 8), "tensor 'w': 8 bytes of data, but F32 [3] needs 12"),
    "overlap": (safetensors_bytes({"a": entry(), "b": entry(data_offsets=[4, 12])}, b"\0" * 16), "overlap those of 'a'"),
    "metadata-not-object": (safetensors_bytes({"__metadata__": [1]}), "__metadata__ is not an object of strings"),
    "metadata-number": (safetensors_bytes({"__metadata__": {"classes": 10}}), "__metadata__ is not an object of strings"),
}


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="load-safetensors-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def write(self, name: str, data: bytes) -> Path:
        path = self.dir / f"{name}.safetensors"
        path.write_bytes(data)
        return path

    def run_script(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=self.dir, env=env, capture_output=True,
                              text=True, timeout=120)

    def model(self, **changes: str) -> Path:
        """A small file whose __metadata__ is META with `changes`: good up to the evaluation itself."""
        name = f"model{len(list(self.dir.glob('model*')))}"
        return self.write(name, safetensors_bytes({"__metadata__": dict(META, **changes), "w": entry()}, b"\0" * 8))

    def assertOneLineError(self, p: subprocess.CompletedProcess, path: Path | str, problem: str):
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stdout, "")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertTrue(lines[0].startswith(f"load_safetensors: error: {path}: "), lines[0])
        self.assertIn(problem, lines[0])


class GoodFile(Base):
    def test_reads_back_exactly(self):
        path = self.write("good", good_file())
        tensors, meta = load_safetensors.read_safetensors(path)
        self.assertEqual(meta, META)
        self.assertEqual(list(tensors), ["conv1.weight", "half", "bn1.num_batches_tracked", "empty"])
        dtype, shape, raw = tensors["conv1.weight"]
        self.assertEqual((dtype, shape, load_safetensors.values(dtype, raw)), ("F32", [2, 3], [k + 0.5 for k in range(6)]))
        self.assertEqual(tensors["half"][:2], ("F16", [2]))
        self.assertEqual(load_safetensors.values("F16", tensors["half"][2]), [1.0, -2.0])
        self.assertEqual(tensors["bn1.num_batches_tracked"][:2], ("I64", []))
        self.assertEqual(load_safetensors.values("I64", tensors["bn1.num_batches_tracked"][2]), [7])
        self.assertEqual(tensors["empty"], ("F32", [0, 4], b""))

    def test_header_order_need_not_be_offset_order(self):
        body = struct.pack("<4f", 1, 2, 3, 4)
        path = self.write("order", safetensors_bytes({"b": entry(data_offsets=[8, 16]), "a": entry()}, body))
        tensors, meta = load_safetensors.read_safetensors(path)
        self.assertEqual(meta, {})
        self.assertEqual(load_safetensors.values("F32", tensors["a"][2]), [1, 2])
        self.assertEqual(load_safetensors.values("F32", tensors["b"][2]), [3, 4])

    @unittest.skipIf(HAVE_TORCH, "PyTorch is installed: the script would go on to evaluate")
    def test_good_file_without_torch_says_so_in_one_line(self):
        p = self.run_script(str(self.write("good", good_file())))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr.splitlines(), ["load_safetensors: error: evaluating needs PyTorch (pip install torch); "
                                                 "reading the file and mapping its names do not"])


class BadFiles(Base):
    def test_read_safetensors_raises_one_error_type_naming_file_and_problem(self):
        for name, (data, problem) in BAD.items():
            with self.subTest(name):
                path = self.write(name, data)
                with self.assertRaises(load_safetensors.SafetensorsError) as cm:
                    load_safetensors.read_safetensors(path)
                self.assertTrue(str(cm.exception).startswith(f"{path}: "), str(cm.exception))
                self.assertIn(problem, str(cm.exception))

    def test_script_prints_one_line_and_exits_1(self):
        for name, (data, problem) in BAD.items():
            with self.subTest(name):
                path = self.write(name, data)
                self.assertOneLineError(self.run_script(str(path)), path, problem)

    def test_main_in_process(self):
        path = self.write("garbage", BAD["garbage-header"][0])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(load_safetensors.main([str(path)]), 1)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertTrue(err.getvalue().startswith(f"load_safetensors: error: {path}: header is not valid JSON"))

    def test_missing_file(self):
        path = self.dir / "nowhere.safetensors"
        self.assertOneLineError(self.run_script(str(path)), path, "No such file or directory")

    def test_directory(self):
        self.assertOneLineError(self.run_script(str(self.dir)), self.dir, "Is a directory")

    def test_a_fifo_is_refused_not_waited_on(self):
        fifo = self.dir / "fifo.safetensors"
        os.mkfifo(fifo)  # no writer: reading it waited forever
        self.assertOneLineError(self.run_script(str(fifo)), fifo, "not a regular file (a FIFO)")

    def test_an_os_error_naming_no_file_is_not_blamed_on_the_model(self):
        def no_file_named(*args):
            raise OSError("Not a gzipped file (b'th')")  # as gzip.BadGzipFile: no filename
        err = io.StringIO()
        with mock.patch.object(load_safetensors, "read_safetensors", no_file_named), contextlib.redirect_stderr(err):
            self.assertEqual(load_safetensors.main([str(self.write("good", good_file()))]), 1)
        self.assertEqual(err.getvalue(), "load_safetensors: error: Not a gzipped file (b'th')\n")

    def test_metadata_without_the_exports_keys(self):
        path = self.write("nometa", safetensors_bytes({"w": entry()}, b"\0" * 8))
        self.assertOneLineError(self.run_script(str(path)), path, "no 'classes' in __metadata__")

    def test_truncated_good_file_names_the_tensor(self):
        data = good_file()
        (n,) = struct.unpack_from("<Q", data, 0)
        for keep, tensor in [(8 + n + 10, "conv1.weight"), (8 + n + 26, "half"), (8 + n + 36, "bn1.num_batches_tracked")]:
            with self.subTest(keep=keep):
                path = self.write(f"cut{keep}", data[:keep])
                p = self.run_script(str(path))
                self.assertOneLineError(p, path, f"tensor {tensor!r}: data_offsets")
                self.assertIn("the file is truncated", p.stderr)


class BadMetadata(Base):
    """The metadata evaluating uses is parsed and checked with the file, before torch: the old script
    checked only that the keys were there, and gave a traceback from int() or json.loads() (or from
    torch's view() on a list of the wrong length; a std of 0 made infinities)."""

    BAD = {  # key -> [(value, a piece of the problem)]
        "classes": [("ten", "__metadata__ classes 'ten' is not a whole number of at least 1"), ("0", "at least 1"),
                    ("-1", "at least 1"), ("1.5", "at least 1"), ("", "at least 1")],
        "input_mean": [("[0.5,0.5]", "__metadata__ input_mean '[0.5,0.5]' is not a JSON list of 3 finite numbers"),
                       ("0.5", "not a JSON list"), ("mean", "not a JSON list"), ('["a","b","c"]', "not a JSON list"),
                       ("[NaN,0.5,0.5]", "finite numbers"), ("[true,0.5,0.5]", "finite numbers")],
        "input_std": [("[0.25,0,0.25]", "__metadata__ input_std '[0.25,0,0.25]': every std must be above 0"),
                      ("[-1,1,1]", "must be above 0"), ("[0.25,0.25,0.25,0.25]", "not a JSON list of 3")],
        "input_side": [("thirty", "__metadata__ input_side 'thirty' is not a whole number of at least 8"),
                       ("4", "at least 8"), ("-32", "at least 8"), ("", "at least 8")],
    }
    # The side a data set's test images are served at, as bin/train --image-size takes it.
    BAD_SIDES = [("fashion-mnist", "29", "__metadata__ input_side 29: Fashion-MNIST is served at 28 plus an even "
                                         "number, up to 64"),
                 ("fashion-mnist", "26", "28 plus an even number"), ("fashion-mnist", "66", "up to 64"),
                 ("cifar10", "28", "__metadata__ input_side 28: CIFAR-10's images are 32x32")]

    def test_each_bad_value_is_one_line_naming_the_file(self):
        for key, cases in self.BAD.items():
            for value, problem in cases:
                with self.subTest(key=key, value=value):
                    path = self.model(**{key: value})
                    self.assertOneLineError(self.run_script(str(path)), path, problem)

    def test_a_side_its_data_set_is_not_served_at_is_one_line_naming_the_file(self):
        for data, side, problem in self.BAD_SIDES:
            with self.subTest(data=data, side=side):
                path = self.model(data=data, input_side=side)
                self.assertOneLineError(self.run_script(str(path)), path, problem)

    def test_good_metadata_is_parsed(self):
        self.assertEqual(load_safetensors.model_metadata("f", META),
                         load_safetensors.ModelMeta(10, "synthetic", [0.5] * 3, [0.25] * 3, 32))
        for data, side in (("fashion-mnist", "28"), ("fashion-mnist", "30"), ("synthetic", "64"), ("cifar10", "32")):
            self.assertEqual(load_safetensors.model_metadata("f", dict(META, data=data, input_side=side)).side, int(side))


class BadTestSet(Base):
    """The test set is read (and checked as bin/train checks it) before torch is imported, and a
    problem with it is one line naming its file: the old script read it after torch, and a corrupt
    t10k .gz was blamed on the model file (gzip's error has no file name), a truncated one a traceback."""

    def setUp(self):
        super().setUp()
        self.fm = self.dir / "fm"
        write_fashion_mnist(self.fm, gz=True)
        self.fashion_model = self.model(data="fashion-mnist")

    def test_a_corrupt_gz_names_the_gz(self):
        gz = self.fm / "t10k-images-idx3-ubyte.gz"
        gz.write_bytes(b"this is not gzip data")
        p = self.run_script(str(self.fashion_model), "--data-dir", str(self.fm))
        self.assertOneLineError(p, gz, "not a valid gzip file (Not a gzipped file")

    def test_a_truncated_gz_names_the_gz(self):
        gz = self.fm / "t10k-labels-idx1-ubyte.gz"
        gz.write_bytes(gz.read_bytes()[:-20])
        p = self.run_script(str(self.fashion_model), "--data-dir", str(self.fm))
        self.assertOneLineError(p, gz, "Compressed file ended before the end-of-stream marker was reached")

    def test_files_checked_as_bin_train_checks_them(self):
        images = self.dir / "raw" / "t10k-images-idx3-ubyte"
        write_fashion_mnist(images.parent)
        os.truncate(images, 1000)
        p = self.run_script(str(self.fashion_model), "--data-dir", str(images.parent))
        self.assertOneLineError(p, images, "truncated: 1,000 bytes, expected 3,936 (the header says 5 images)")
        cifar = self.dir / "cifar"
        cifar.mkdir()
        (cifar / "test_batch.bin").write_bytes(bytes(5000))
        p = self.run_script(str(self.model(data="cifar10")), "--data-dir", str(cifar))
        self.assertOneLineError(p, cifar / "test_batch.bin", "5,000 bytes, expected a whole number of 3073-byte records")

    def test_missing_files(self):
        p = self.run_script(str(self.model(data="cifar10")), "--data-dir", str(self.dir / "nowhere"))
        self.assertOneLineError(p, self.dir / "nowhere" / "test_batch.bin", "No such file or directory")
        p = self.run_script(str(self.fashion_model), "--data-dir", str(self.dir / "nowhere"))
        self.assertOneLineError(p, self.dir / "nowhere" / "t10k-images-idx3-ubyte", "No such file or directory")
        env = {k: v for k, v in os.environ.items() if k != "FASHION_MNIST_DIR"}
        env["FASHION_MNIST_PACKAGE_DIR"] = str(self.dir / "no-package")
        p = self.run_script(str(self.fashion_model), env=env)
        self.assertEqual((p.returncode, p.stderr.splitlines()), (1, [
            f"load_safetensors: error: Fashion-MNIST not found in data/fashion-mnist, {self.dir / 'no-package'}"]))


class CompareCsvAndClasses(Base):
    """--compare-csv and the fc tensors' rows are checked before torch too: the old script read the CSV
    after evaluating (a KeyError or ValueError traceback on a CSV of other columns or values) and
    left a classes that fc does not have to load_state_dict's multi-line traceback."""

    def setUp(self):
        super().setUp()
        self.fm = self.dir / "fm"
        write_fashion_mnist(self.fm, test=5)

    def csv(self, text: str) -> Path:
        path = self.dir / "predictions.csv"
        path.write_text(text)
        return path

    def test_bad_csvs(self):
        model = self.model(data="fashion-mnist")
        header = "id,label,label_name,predicted,predicted_name\n"
        for text, problem in [("id,label\n0,1\n", "no 'predicted' column (not a predictions CSV of bin/predict?)"),
                              ("", "no 'predicted' column"),
                              (header + "0,0,a,1,b\n1,0,a,x,b\n", "line 3: predicted 'x' is not a class number"),
                              (header + "0,0,a,1,b\n1,0,a\n", "line 3: predicted None is not a class number"),
                              (header + "0,0,a,1,b\n", "")]:
            with self.subTest(text=text):
                csv = self.csv(text)
                p = self.run_script(str(model), "--data-dir", str(self.fm), "--compare-csv", str(csv))
                if problem:
                    self.assertOneLineError(p, csv, problem)
                else:  # one row for a test set of 5
                    self.assertEqual(p.stderr.splitlines(), [f"load_safetensors: error: {csv} has 1 rows, the test set 5"])
                    self.assertEqual(p.returncode, 1)

    def test_a_csv_that_is_not_text_or_not_a_file(self):
        # Random bytes were a UnicodeDecodeError traceback, a FIFO a hang (timeout 60 stopped it).
        model = self.model(data="fashion-mnist")
        fifo = self.dir / "fifo.csv"
        os.mkfifo(fifo)
        binary = self.dir / "random.csv"
        binary.write_bytes(bytes(range(256)) * 8)
        huge = self.dir / "huge.csv"
        huge.write_text("id,predicted\n0," + "7" * 200_000 + "\n")  # past the csv module's field limit
        for path, problem in ((fifo, "not a regular file (a FIFO)"),
                              (binary, "not UTF-8 text (invalid start byte): not a predictions CSV of bin/predict"),
                              (huge, "not a CSV file (field larger than field limit")):
            with self.subTest(path=path.name):
                p = self.run_script(str(model), "--data-dir", str(self.fm), "--compare-csv", str(path))
                self.assertOneLineError(p, path, problem)

    def test_a_test_set_file_that_is_a_fifo_is_refused(self):
        fm = self.dir / "fifo-fm"
        write_fashion_mnist(fm)
        labels = fm / "t10k-labels-idx1-ubyte"
        labels.unlink()
        os.mkfifo(labels)
        p = self.run_script(str(self.model(data="fashion-mnist")), "--data-dir", str(fm))
        self.assertOneLineError(p, labels, "not a regular file (a FIFO)")

    def test_fc_rows_must_be_the_classes(self):
        header = {"__metadata__": META, "fc.weight": entry(shape=[3, 2], data_offsets=[0, 24]),
                  "fc.bias": entry(shape=[3], data_offsets=[24, 36])}
        path = self.write("fc3", safetensors_bytes(header, b"\0" * 36))
        self.assertOneLineError(self.run_script(str(path)), path,
                                "tensor 'fc.weight' has shape [3, 2], but __metadata__ classes is 10")
        path = self.write("fc10", safetensors_bytes(dict(header, **{"__metadata__": dict(META, classes="3")}), b"\0" * 36))
        p = self.run_script(str(path))  # the rows agree: the file goes on to the PyTorch check
        self.assertNotIn("fc.weight", p.stderr)


@unittest.skipUnless(HAVE_TORCH, "needs PyTorch: the model is built and the device used only once torch is there")
class AfterTorch(Base):
    """With torch: a --device that cannot be used, a tensor name ResNet50Cifar lacks and a file that does
    not fill the model are each one line (the old script gave torch's tracebacks)."""

    def setUp(self):
        super().setUp()
        write_fashion_mnist(self.dir / "fm", test=2)

    def run_on_fm(self, path: Path, *args: str) -> subprocess.CompletedProcess:
        return self.run_script(str(path), "--data-dir", str(self.dir / "fm"), *args)

    def test_a_model_of_synthetic_data(self):
        p = self.run_script(str(self.write("good", good_file())))
        self.assertEqual((p.returncode, p.stdout), (1, ""))
        self.assertEqual(p.stderr.splitlines(), ["load_safetensors: error: the model was trained on 'synthetic'; only "
                                                 "cifar10 and fashion-mnist have a test set to evaluate on (synthetic "
                                                 "data is random)"])

    def test_a_device_that_cannot_be_used(self):
        p = self.run_on_fm(self.model(data="fashion-mnist"), "--device", "nonsense")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertTrue(p.stderr.startswith("load_safetensors: error: --device nonsense: "), p.stderr)

    def test_a_name_resnet50cifar_lacks(self):
        path = self.model(data="fashion-mnist")  # its one tensor is 'w'
        self.assertOneLineError(self.run_on_fm(path, "--device", "cpu"), path, "w: not a parameter of the CIFAR ResNet-50")

    def test_a_file_that_does_not_fill_the_model(self):
        header = {"__metadata__": dict(META, data="fashion-mnist"),
                  "fc.weight": entry(shape=[10, 2048], data_offsets=[0, 4 * 20480]),
                  "fc.bias": entry(shape=[10], data_offsets=[4 * 20480, 4 * 20490])}
        path = self.write("fc", safetensors_bytes(header, b"\0" * 4 * 20490))
        p = self.run_on_fm(path, "--device", "cpu")
        self.assertOneLineError(p, path, "does not fit ResNet50Cifar(num_classes=10) of bench/lib/pytorch_resnet.py")
        self.assertIn("stem.0.weight", p.stderr)


class Options(Base):
    def test_batch_must_be_at_least_one(self):  # the old script took 0 and failed in range() after evaluating
        path = self.write("good", good_file())
        for batch, problem in (("0", "must be at least 1, not 0"), ("-3", "must be at least 1, not -3"),
                               ("x", "'x' is not a whole number")):
            with self.subTest(batch=batch):
                p = self.run_script(str(path), "--batch", batch)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertNotIn("Traceback", p.stderr)
                self.assertEqual(p.stderr.splitlines()[-1], f"load_safetensors.py: error: argument --batch: {problem}")


class TestSetWhereTrainFindsIt(Base):
    """Without --data-dir, Fashion-MNIST's test split is read from the directory bin/train --data auto
    trains on (data/dataset_files.py, shared with make_folder.py): $FASHION_MNIST_DIR, then
    data/fashion-mnist from where it runs, then the package's directory, FASHION_MNIST_PACKAGE_DIR here
    as for prepare.sh and the Makefile; the first holding train-images-idx3-ubyte(.gz) wins."""

    def setUp(self):
        super().setUp()
        self.package_dir = self.dir / "package"
        cwd = os.getcwd()
        os.chdir(self.dir)  # data/fashion-mnist is relative, as for bin/train
        self.addCleanup(os.chdir, cwd)

    def labels(self, fashion_mnist_dir=None) -> list[int]:
        """The test labels read_test_set finds: write_fashion_mnist's 0, 1, 2, ... in turn, as many as
        the directory has test images."""
        env = {k: v for k, v in os.environ.items() if k != "FASHION_MNIST_DIR"}
        env["FASHION_MNIST_PACKAGE_DIR"] = str(self.package_dir)
        if fashion_mnist_dir is not None:
            env["FASHION_MNIST_DIR"] = str(fashion_mnist_dir)
        with mock.patch.dict(os.environ, env, clear=True):
            images, labels, channels = load_safetensors.read_test_set("fashion-mnist", None)
        self.assertEqual((len(images), channels), (len(labels) * 32 * 32, 1))
        return labels

    def test_the_package_dir_is_fashion_mnist_package_dir(self):
        write_fashion_mnist(self.package_dir, gz=True, test=3)
        self.assertEqual(self.labels(), [0, 1, 2])  # the old script looked in /usr/share/datasets only

    def test_in_bin_trains_order(self):
        write_fashion_mnist(self.package_dir, test=2)
        write_fashion_mnist(self.dir / "data" / "fashion-mnist", test=3)
        write_fashion_mnist(self.dir / "fmraw", test=4)
        self.assertEqual(len(self.labels(fashion_mnist_dir=self.dir / "fmraw")), 4)
        self.assertEqual(len(self.labels()), 3)
        write_fashion_mnist(self.dir / "tests-only", test=5)
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
            (self.dir / "tests-only" / name).unlink()
        # Its test files alone do not make it the directory bin/train trained on: passed over.
        self.assertEqual(len(self.labels(fashion_mnist_dir=self.dir / "tests-only")), 3)
        shutil.rmtree(self.dir / "data")
        self.assertEqual(len(self.labels(fashion_mnist_dir="")), 2)


class TruncatedExport(Base):
    """A real export of bin/predict (of the PredictSamples checkpoint), cut as `head -c` would cut it."""

    def test_truncated_export_is_refused(self):
        from tests.python.predict_samples import PREDICT, UNIT_TESTS, samples
        if not (UNIT_TESTS.exists() and PREDICT.exists()):
            self.skipTest("bin/unit_tests or bin/predict is not built (make)")
        try:
            d = samples()
        except RuntimeError as e:
            self.skipTest(str(e))
        model = self.dir / "model.safetensors"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        p = subprocess.run([str(PREDICT), "--checkpoint", str(d / "sample.ckpt"), "--data", "synthetic",
                            "--synthetic-size", "256", "--export", str(model)],
                           cwd=self.dir, env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            self.skipTest(f"bin/predict --export failed here: {p.stderr[-500:]}")
        tensors, _ = load_safetensors.read_safetensors(model)
        self.assertEqual(len(tensors), 320)
        data = model.read_bytes()
        cut = self.write("cut", data[:len(data) // 2])
        del data
        p = self.run_script(str(cut))
        self.assertOneLineError(p, cut, "the file is truncated")
        self.assertRegex(p.stderr, r"tensor '[^']+': data_offsets \[\d+, \d+\] run past the end of the data")


if __name__ == "__main__":
    unittest.main()
