"""bin/predict's files read back by readers that share no code with the writers: .npy with numpy when
it is installed and always with a parser of the format written here from its specification,
safetensors from its own layout (and with the safetensors package when installed), the predictions
CSV with Python's csv module; and `bin/predict --export` end to end, without a GPU: every tensor of a
sample checkpoint comes out under its torchvision name, in PyTorch's element order, with the values
the checkpoint's formula gives, and maps onto bench/lib/pytorch_resnet.py's model (loaded into it when
PyTorch is installed).
"""

import ast
import csv
import importlib.util
import json
import math
import os
import struct
import subprocess
import tempfile
import unittest
from pathlib import Path

from tests.python import BENCH
from tests.python.predict_samples import PREDICT, UNIT_TESTS, sample_running, sample_value, samples
from tests.python.test_data_scripts import write_fashion_mnist

import load_safetensors  # bench/, on sys.path through tests/python/__init__.py

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
NPY_TYPES = {"<f4": ("f", 4), "<f2": ("e", 2)}


def read_npy(path):
    """(descr, shape, values) of a version 1.0 .npy file, parsed from the format's specification."""
    data = path.read_bytes()
    assert data[:6] == b"\x93NUMPY", "magic"
    assert (data[6], data[7]) == (1, 0), f"version {data[6]}.{data[7]}"
    (hlen,) = struct.unpack_from("<H", data, 8)
    header = data[10:10 + hlen].decode("latin1")
    assert header.endswith("\n") and (10 + hlen) % 64 == 0, "header padding and alignment"
    d = ast.literal_eval(header)
    assert d["fortran_order"] is False
    code, size = NPY_TYPES[d["descr"]]
    count = math.prod(d["shape"])
    body = data[10 + hlen:]
    assert len(body) == count * size, f"{len(body)} data bytes for {count} elements"
    return d["descr"], tuple(d["shape"]), list(struct.unpack(f"<{count}{code}", body))


@unittest.skipUnless(UNIT_TESTS.exists(), f"{UNIT_TESTS} is not built (make bin/unit_tests)")
class WrittenFiles(unittest.TestCase):
    def setUp(self):
        self.dir = samples()

    def test_npy_arrays_of_both_types_and_shapes(self):
        for name, descr, shape in [("f32-5x7.npy", "<f4", (5, 7)), ("f16-5x7.npy", "<f2", (5, 7)),
                                   ("f32-6.npy", "<f4", (6,))]:
            with self.subTest(name):
                got_descr, got_shape, got = read_npy(self.dir / name)
                self.assertEqual((got_descr, got_shape), (descr, shape))
                self.assertEqual(got, [k + 0.5 - 20 for k in range(math.prod(shape))])

    @unittest.skipUnless(HAVE_NUMPY, "numpy is not installed (the format's own parser reads the files above)")
    def test_numpy_loads_them(self):
        import numpy as np
        a = np.load(self.dir / "f16-5x7.npy")
        self.assertEqual((a.dtype, a.shape), (np.float16, (5, 7)))
        self.assertEqual(a.reshape(-1).tolist(), [k + 0.5 - 20 for k in range(35)])
        b = np.load(self.dir / "f32-6.npy")
        self.assertEqual((b.dtype, b.shape), (np.float32, (6,)))

    def test_safetensors_writer(self):
        raw = (self.dir / "writer.safetensors").read_bytes()
        (n,) = struct.unpack_from("<Q", raw, 0)
        self.assertEqual((8 + n) % 8, 0)
        tensors, meta = load_safetensors.read_safetensors(self.dir / "writer.safetensors")
        self.assertEqual(meta, {"format": "pt", "quoted": 'a "b" \\ c'})
        self.assertEqual(list(tensors), ["layer.weight", "layer.steps", "half"])
        dtype, shape, data = tensors["layer.weight"]
        self.assertEqual((dtype, shape), ("F32", [2, 3]))
        self.assertEqual(load_safetensors.values(dtype, data), [k + 0.5 - 20 for k in range(6)])
        self.assertEqual(tensors["layer.steps"][:2], ("I64", []))
        self.assertEqual(load_safetensors.values("I64", tensors["layer.steps"][2]), [7])
        self.assertEqual(load_safetensors.values("F16", tensors["half"][2]), [1.0, -1.0])
        self.assertEqual(len(raw), 8 + n + 24 + 8 + 4, "the data end at the last offset")

    @unittest.skipUnless(importlib.util.find_spec("safetensors") is not None, "the safetensors package is not installed")
    def test_the_safetensors_package_reads_it(self):
        from safetensors import safe_open
        with safe_open(str(self.dir / "writer.safetensors"), framework="numpy") as f:
            self.assertEqual(sorted(f.keys()), ["half", "layer.steps", "layer.weight"])
            self.assertEqual(f.metadata()["format"], "pt")

    def test_predictions_csv(self):
        with open(self.dir / "predictions.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(list(rows[0]), ["id", "label", "label_name", "predicted", "predicted_name", "top1", "p1",
                                         "top2", "p2"])
        self.assertEqual([r["id"] for r in rows], ["a.png", "dir,with,commas/b.png", 'say "c".png'])
        self.assertEqual([r["label_name"] for r in rows], ["zero", "three", "one, or two"])
        self.assertEqual([r["predicted"] for r in rows], ["0", "2", "1"])
        # Row 0: logits (3, 0, -1) plus the bias (0, 0, 1): softmax of (3, 0, 0); the tie of classes
        # 1 and 2 goes to the lower one.
        e = math.exp(3)
        self.assertAlmostEqual(float(rows[0]["p1"]), e / (e + 2), places=6)
        self.assertEqual(rows[0]["top2"], "1")
        self.assertAlmostEqual(float(rows[0]["p2"]), 1 / (e + 2), places=6)


@unittest.skipUnless(UNIT_TESTS.exists() and PREDICT.exists(), "bin/unit_tests and bin/predict are not both built")
class Export(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = samples()
        cls.model = cls.dir / "model.safetensors"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the export must not need a GPU
        cls.export_run = subprocess.run([str(PREDICT), "--checkpoint", str(cls.dir / "sample.ckpt"), "--data", "synthetic",
                                  "--synthetic-size", "256", "--export", str(cls.model)],
                                 cwd=cls.dir, env=env, capture_output=True, text=True, timeout=300)

    def setUp(self):
        self.assertEqual(self.export_run.returncode, 0, self.export_run.stderr)
        self.tensors, self.meta = load_safetensors.read_safetensors(self.model)

    def test_every_parameter_in_pytorch_order_with_the_checkpoints_values(self):
        params = [n for n in self.tensors if not n.endswith(("running_mean", "running_var", "num_batches_tracked"))]
        self.assertEqual(len(params), 161)
        self.assertEqual(sum(math.prod(self.tensors[n][1]) for n in params), 23_520_842)
        for i, name in enumerate(params):  # the file lists the parameters in the network's order
            dtype, shape, raw = self.tensors[name]
            self.assertEqual(dtype, "F32", name)
            count = math.prod(shape)
            for e in sorted({0, 1, count // 3, count // 2, count - 1}):
                (v,) = struct.unpack_from("<f", raw, 4 * e)
                self.assertEqual(v, sample_value(i, e), f"{name}[{e}]")
        self.assertEqual(self.tensors["conv1.weight"][1], [64, 3, 3, 3])
        self.assertEqual(self.tensors["fc.weight"][1], [10, 2048])

    def test_bn_statistics_follow_each_bn(self):
        bns = [n[:-len(".running_mean")] for n in self.tensors if n.endswith(".running_mean")]
        self.assertEqual(len(bns), 53)
        offset = 0
        for bn in bns:
            mean = load_safetensors.values("F32", self.tensors[bn + ".running_mean"][2])
            var = load_safetensors.values("F32", self.tensors[bn + ".running_var"][2])
            self.assertEqual(len(mean), len(var))
            self.assertEqual(mean[0], sample_running(offset), bn)
            self.assertEqual(var[-1], sample_running(offset + 2 * len(mean) - 1), bn)
            offset += 2 * len(mean)
            dtype, shape, raw = self.tensors[bn + ".num_batches_tracked"]
            self.assertEqual((dtype, shape, load_safetensors.values(dtype, raw)), ("I64", [], [1234]))

    def test_metadata_carries_what_evaluation_needs(self):
        self.assertEqual(self.meta["format"], "pt")
        self.assertEqual(self.meta["data"], "synthetic")
        self.assertEqual(self.meta["classes"], "10")
        self.assertEqual(json.loads(self.meta["class_names"]), [str(c) for c in range(10)])
        for key in ("input_mean", "input_std"):
            v = json.loads(self.meta[key])
            self.assertEqual(len(v), 3)
            self.assertTrue(all(0 < x < 1 for x in v), v)  # random uint8 pixels: mean ~0.5, std ~0.29
        self.assertEqual(self.meta["input_side"], "32")
        self.assertEqual(self.meta["trained_build"], "fp16/NHWC")

    def test_names_map_onto_pytorch_resnet(self):
        mapped = [load_safetensors.pytorch_resnet_name(n) for n in self.tensors]
        self.assertEqual(len(set(mapped)), len(mapped))
        self.assertEqual(load_safetensors.pytorch_resnet_name("conv1.weight"), "stem.0.weight")
        self.assertEqual(load_safetensors.pytorch_resnet_name("bn1.running_var"), "stem.1.running_var")
        self.assertEqual(load_safetensors.pytorch_resnet_name("layer1.0.downsample.1.bias"), "blocks.0.shortcut.1.bias")
        self.assertEqual(load_safetensors.pytorch_resnet_name("layer2.0.conv1.weight"), "blocks.3.conv1.weight")
        self.assertEqual(load_safetensors.pytorch_resnet_name("layer4.2.bn3.num_batches_tracked"),
                         "blocks.15.bn3.num_batches_tracked")
        self.assertEqual(load_safetensors.pytorch_resnet_name("fc.bias"), "fc.bias")
        for bad in ("layer1.3.conv1.weight", "layer5.0.conv1.weight", "head.weight"):
            with self.assertRaises(ValueError):
                load_safetensors.pytorch_resnet_name(bad)

    @unittest.skipUnless(HAVE_TORCH, "PyTorch is not installed: the mapped names are checked above instead")
    def test_pytorch_model_loads_it_strictly(self):
        import sys
        import torch
        sys.path.insert(0, str(BENCH))
        from lib.pytorch_resnet import ResNet50Cifar
        model = ResNet50Cifar(10)
        types = {"F32": torch.float32, "I64": torch.int64}
        state = {load_safetensors.pytorch_resnet_name(n): torch.frombuffer(bytearray(raw), dtype=types[d]).reshape(s)
                 for n, (d, s, raw) in self.tensors.items()}
        model.load_state_dict(state, strict=True)
        self.assertEqual(float(model.stem[0].weight[0, 0, 0, 1]), sample_value(0, 1))


class LoadScriptData(unittest.TestCase):
    """The test sets bench/load_safetensors.py evaluates on, read as bin/train reads them."""

    def test_fashion_mnist_is_padded_to_32_like_the_trainers(self):
        d = os.environ.get("FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist"
        if not os.path.exists(os.path.join(d, "t10k-images-idx3-ubyte.gz")):
            self.skipTest(f"Fashion-MNIST is not installed in {d}")
        images, labels, channels = load_safetensors.read_test_set("fashion-mnist", d)
        self.assertEqual((len(labels), channels, len(images)), (10000, 1, 10000 * 32 * 32))
        self.assertTrue(all(0 <= l < 10 for l in labels))
        first = images[:1024]
        border = [first[y * 32 + x] for y in range(32) for x in range(32) if min(x, y) < 2 or max(x, y) > 29]
        self.assertEqual(set(border), {0}, "the 2-pixel border is empty")
        self.assertGreater(sum(first), 0)

    def test_fashion_mnist_at_the_side_the_model_was_trained_at(self):
        with tempfile.TemporaryDirectory() as d:
            write_fashion_mnist(Path(d), test=3)
            images28, labels, channels = load_safetensors.read_test_set("fashion-mnist", d, 28)
            images30, _, _ = load_safetensors.read_test_set("fashion-mnist", d, 30)
        self.assertEqual((labels, channels, len(images28), len(images30)), ([0, 1, 2], 1, 3 * 28 * 28, 3 * 30 * 30))
        self.assertEqual(images28, bytes((i * 7) % 256 for i in range(3 * 28 * 28)), "28: the images as the files hold them")
        second = images30[900:1800]
        self.assertEqual([second[(y + 1) * 30 + 1:(y + 1) * 30 + 29] for y in range(28)],
                         [images28[784 + y * 28:784 + (y + 1) * 28] for y in range(28)], "30: one zero pixel each edge")
        self.assertEqual(sum(second[:30]) + sum(second[-30:]) + sum(second[y * 30] + second[y * 30 + 29] for y in range(30)),
                         0)

    def test_cifar10_test_batch(self):
        with tempfile.TemporaryDirectory() as d:
            record = bytes([7]) + bytes(range(256)) * 12
            Path(d, "test_batch.bin").write_bytes(record * 3)
            images, labels, channels = load_safetensors.read_test_set("cifar10", d)
        self.assertEqual((labels, channels, images[:3072]), ([7, 7, 7], 3, record[1:]))

    def test_synthetic_has_no_test_set_to_evaluate(self):
        with self.assertRaises(SystemExit):
            load_safetensors.read_test_set("synthetic", None)


if __name__ == "__main__":
    unittest.main()
