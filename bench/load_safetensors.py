#!/usr/bin/env python3
"""Loads a model exported by `bin/predict --export FILE.safetensors` into the PyTorch model of
bench/lib/pytorch_resnet.py and evaluates it on the test set it was trained on.

    python3 bench/load_safetensors.py model.safetensors                      # data found as bin/train finds it
    python3 bench/load_safetensors.py model.safetensors --data-dir DIR --compare-csv predictions.csv

The file holds torchvision-style names (conv1, bn1, layer1.0.conv2, layer2.0.downsample.0, fc, the
names bin/train's parameters have); lib/pytorch_resnet.py names the same modules stem.0, stem.1,
blocks.N and shortcut.0/1, so each name is mapped (pytorch_resnet_name()). The input normalisation
(mean and std per channel of the training set) comes from the file's metadata. Prints the accuracy
and, with --compare-csv, how often PyTorch's prediction equals bin/predict's.

Reading the file and mapping the names need only the standard library (the tests run them without
PyTorch); evaluating needs torch. The inputs are checked before torch is imported: the file, its
metadata (classes, matching fc's rows, and the mean and std of each of the model's 3 input channels),
the test set (read and checked as bin/train reads it, data/dataset_files.py) and --compare-csv. A
problem with any of them, a missing PyTorch, a --device that cannot be used, or tensors that do not
fill ResNet50Cifar is one `load_safetensors: error:` line and exit status 1; a bad option is a usage
error (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import struct
import sys
from pathlib import Path
from typing import NamedTuple

DATA = Path(__file__).resolve().parent.parent / "data"
if str(DATA) not in sys.path:
    sys.path.insert(0, str(DATA))
from dataset_files import (CIFAR_RECORD, CIFAR_SIDE, MNIST_MAX_SIDE, MNIST_SIDE, DataError,  # noqa: E402  (data/,
                           centre_on_canvas, check_regular_file, fashion_mnist_canvas_fits,  # shared with
                           fashion_mnist_dirs, find_fashion_mnist_dir, read_cifar_batch, read_file,  # make_folder.py)
                           read_idx_pair)

STAGE_BLOCKS = (3, 4, 6, 3)  # bottleneck blocks per stage, as lib/pytorch_resnet.py builds them
DTYPES = {"F32": ("f", 4), "F16": ("e", 2), "I64": ("q", 8)}
MODEL_CHANNELS = 3  # the stem's input channels; a grey image is replicated into all three
TEST_SETS = ("cifar10", "fashion-mnist")


class InputError(Exception):
    """Input that cannot be evaluated (or no PyTorch to do it with); main prints str() as one
    `load_safetensors: error:` line."""


class SafetensorsError(InputError, ValueError):
    """A file that is not a well-formed safetensors file; str() names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(f"{path}: {problem}")


def read_safetensors(path: str | Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict[str, str]]:
    """{name: (dtype, shape, raw little-endian bytes)} and the metadata, from the file's own layout.

    Every entry is checked against the file (a known dtype, a shape of non-negative integers, offsets in
    order within the body, spanning exactly element size x product(shape) bytes), so a truncated or
    damaged file raises SafetensorsError (naming the file and the problem) instead of giving short
    tensors. A file that cannot be read raises OSError; one that is not a regular file (a FIFO would
    be waited on forever) DataError."""
    data = read_file(path)
    if len(data) < 8:
        raise SafetensorsError(path, f"{len(data)} bytes, too short for a safetensors file (8-byte header length)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise SafetensorsError(path, f"header length {n} runs past the end of the file ({len(data)} bytes): "
                                     "truncated or not a safetensors file")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SafetensorsError(path, f"header is not UTF-8 ({e.reason} at byte {8 + e.start})") from None
    except ValueError as e:  # json.JSONDecodeError
        raise SafetensorsError(path, f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, f"header is a JSON {type(header).__name__}, not an object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise SafetensorsError(path, "__metadata__ is not an object of strings")
    body = data[8 + n:]
    tensors, spans = {}, []
    for name, entry in header.items():
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise SafetensorsError(path, f"{where}: entry is not a JSON object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise SafetensorsError(path, f"{where}: no {key}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise SafetensorsError(path, f"{where}: dtype {dtype!r} is not a string")
        if dtype not in DTYPES:
            raise SafetensorsError(path, f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise SafetensorsError(path, f"{where}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets)):
            raise SafetensorsError(path, f"{where}: data_offsets {offsets!r} is not two non-negative integers")
        begin, end = offsets
        if end < begin:
            raise SafetensorsError(path, f"{where}: data_offsets [{begin}, {end}] end before they begin")
        if end > len(body):
            raise SafetensorsError(path, f"{where}: data_offsets [{begin}, {end}] run past the end of the data "
                                         f"({len(body)} bytes): the file is truncated")
        count = 1
        for d in shape:
            count *= d
        expected = DTYPES[dtype][1] * count
        if end - begin != expected:
            raise SafetensorsError(path, f"{where}: {end - begin} bytes of data, but {dtype} {shape} needs {expected}")
        tensors[name] = (dtype, list(shape), body[begin:end])
        spans.append((begin, end, name))
    previous_end, previous_name = 0, None
    for begin, end, name in sorted(spans):  # in offset order, whatever order the header lists them in
        if begin < previous_end:
            raise SafetensorsError(path, f"tensor {name!r}: data_offsets [{begin}, {end}] overlap those of "
                                         f"{previous_name!r} (ending at {previous_end})")
        if end > begin:
            previous_end, previous_name = end, name
    return tensors, meta


def values(dtype: str, raw: bytes) -> list:
    """The elements of a tensor's bytes as Python numbers (no numpy needed)."""
    code, size = DTYPES[dtype]
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def pytorch_resnet_name(name: str) -> str:
    """torchvision-style name -> the name of the same tensor in pytorch_resnet.ResNet50Cifar."""
    m = re.fullmatch(r"(conv1|bn1)\.(.+)", name)
    if m:
        return f"stem.{0 if m.group(1) == 'conv1' else 1}.{m.group(2)}"
    m = re.fullmatch(r"layer([1-4])\.(\d+)\.(.+)", name)
    if m:
        stage, index, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        if index >= STAGE_BLOCKS[stage - 1]:
            raise ValueError(f"{name}: stage {stage} has {STAGE_BLOCKS[stage - 1]} blocks")
        block = sum(STAGE_BLOCKS[:stage - 1]) + index
        return f"blocks.{block}." + re.sub(r"^downsample\.", "shortcut.", rest)
    if name.startswith("fc."):
        return name
    raise ValueError(f"{name}: not a parameter of the CIFAR ResNet-50")


class ModelMeta(NamedTuple):
    classes: int
    data: str
    mean: list[float]
    std: list[float]
    side: int = 32  # the side of the images it was trained on (bin/train --image-size)


def model_metadata(path: str | Path, meta: dict[str, str], tensors: dict | None = None) -> ModelMeta:
    """What evaluating takes from the __metadata__ that bin/predict --export writes, parsed and checked:
    classes a whole number of at least 1 (the size of fc: the rows of the file's fc tensors, when
    `tensors` are given), input_mean and input_std JSON lists of one finite number per model channel,
    each std above 0 (the inputs are divided by it), input_side (32 where the file has none) a side
    its data set is served at: 32 for CIFAR-10, 28 plus an even number up to 64 for Fashion-MNIST (its
    28x28 images centred on a zero canvas). A problem raises SafetensorsError naming the file."""
    for key in ("classes", "data", "input_mean", "input_std"):
        if key not in meta:
            raise SafetensorsError(path, f"no {key!r} in __metadata__ (not written by bin/predict --export?)")
    if not re.fullmatch(r"[0-9]+", meta["classes"]) or int(meta["classes"]) < 1:
        raise SafetensorsError(path, f"__metadata__ classes {meta['classes']!r} is not a whole number of at least 1")
    for name in ("fc.weight", "fc.bias"):
        shape = (tensors or {}).get(name, (None, None))[1]
        if shape is not None and shape[:1] != [int(meta["classes"])]:
            raise SafetensorsError(path, f"tensor {name!r} has shape {shape}, but __metadata__ classes is "
                                         f"{meta['classes']}")
    mean, std = _channel_values(path, meta, "input_mean"), _channel_values(path, meta, "input_std")
    if min(std) <= 0:
        raise SafetensorsError(path, f"__metadata__ input_std {meta['input_std']!r}: every std must be above 0")
    return ModelMeta(int(meta["classes"]), meta["data"], mean, std, _input_side(path, meta))


def _input_side(path: str | Path, meta: dict[str, str]) -> int:
    side = meta.get("input_side", str(CIFAR_SIDE))
    if not re.fullmatch(r"[0-9]+", side) or int(side) < 8:
        raise SafetensorsError(path, f"__metadata__ input_side {side!r} is not a whole number of at least 8")
    side = int(side)
    if meta["data"] == "cifar10" and side != CIFAR_SIDE:
        raise SafetensorsError(path, f"__metadata__ input_side {side}: CIFAR-10's images are {CIFAR_SIDE}x{CIFAR_SIDE}")
    if meta["data"] == "fashion-mnist" and not fashion_mnist_canvas_fits(side):
        raise SafetensorsError(path, f"__metadata__ input_side {side}: Fashion-MNIST is served at 28 plus an even "
                                     f"number, up to {MNIST_MAX_SIDE}")
    return side


def _channel_values(path: str | Path, meta: dict[str, str], key: str) -> list[float]:
    try:
        v = json.loads(meta[key])
    except ValueError:
        v = None
    if (not isinstance(v, list) or len(v) != MODEL_CHANNELS
            or not all(type(x) in (int, float) and math.isfinite(x) for x in v)):
        raise SafetensorsError(path, f"__metadata__ {key} {meta[key]!r} is not a JSON list of {MODEL_CHANNELS} "
                                     "finite numbers (one per input channel)")
    return [float(x) for x in v]


def read_test_set(data: str, data_dir: str | None, side: int = 32) -> tuple[bytes, list[int], int]:
    """uint8 images (count x channels x side x side), labels and channels of the test split, read from
    the same files bin/train reads and checked as it checks them (a problem raises DataError, or
    OSError, naming the file): Fashion-MNIST's t10k files from --data-dir, else from the directory
    bin/train --data auto trains on (find_fashion_mnist_dir), each image centred on a side x side zero
    canvas as bin/train --image-size serves it (CIFAR-10's are 32x32)."""
    if data == "cifar10":
        raw = read_cifar_batch(Path(data_dir or "data/cifar-10-batches-bin") / "test_batch.bin")
        records = [raw[i:i + CIFAR_RECORD] for i in range(0, len(raw), CIFAR_RECORD)]
        return b"".join(r[1:] for r in records), [r[0] for r in records], 3
    if data == "fashion-mnist":
        directory = Path(data_dir) if data_dir else find_fashion_mnist_dir()
        if directory is None:
            raise InputError(f"Fashion-MNIST not found in {', '.join(fashion_mnist_dirs())}")
        _, images, labels = read_idx_pair(directory, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
        return centre_on_canvas(images[16:], MNIST_SIDE, side), list(labels[8:]), 1
    raise no_test_set(data)


def no_test_set(data: str) -> SystemExit:
    """The one refusal that is a SystemExit (status 1, the line printed by Python), as read_test_set's
    callers have always had it (tests/python/test_predict_files.py catches it), in the same format."""
    return SystemExit(f"load_safetensors: error: the model was trained on {data!r}; only {' and '.join(TEST_SETS)} "
                      "have a test set to evaluate on (synthetic data is random)")


def predicted_column(path: str) -> list[int]:
    """The `predicted` column of a predictions CSV of bin/predict; a problem raises InputError naming
    the file (bytes that are not UTF-8 text or CSV included; one that is not a regular file, DataError;
    an unreadable one, OSError)."""
    check_regular_file(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if "predicted" not in (reader.fieldnames or []):
                raise InputError(f"{path}: no 'predicted' column (not a predictions CSV of bin/predict?)")
            column = []
            for row in reader:
                if not re.fullmatch(r"[0-9]+", row["predicted"] or ""):
                    raise InputError(f"{path}: line {reader.line_num}: predicted {row['predicted']!r} is not a "
                                     "class number")
                column.append(int(row["predicted"]))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason}): not a predictions CSV of bin/predict") from None
    except csv.Error as e:
        raise InputError(f"{path}: not a CSV file ({e}): not a predictions CSV of bin/predict") from None
    return column


def evaluate(args: argparse.Namespace) -> int:
    # The inputs are read and checked first, so that a bad one is reported with or without torch (a model
    # of data with no test set is refused after the torch check, as it always was).
    tensors, raw_meta = read_safetensors(args.model)
    meta = model_metadata(args.model, raw_meta, tensors)
    test_set = read_test_set(meta.data, args.data_dir, meta.side) if meta.data in TEST_SETS else None
    theirs = predicted_column(args.compare_csv) if args.compare_csv else None
    if test_set is not None and theirs is not None and len(theirs) != len(test_set[1]):
        raise InputError(f"{args.compare_csv} has {len(theirs)} rows, the test set {len(test_set[1])}")
    try:
        import torch  # only here: reading and mapping work without it
    except ImportError:
        raise InputError("evaluating needs PyTorch (pip install torch); reading the file and mapping its "
                         "names do not") from None
    if test_set is None:
        raise no_test_set(meta.data)
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch.empty(0, device=device)  # a device that cannot be used fails here, before the model is built
    except (RuntimeError, AssertionError) as e:  # AssertionError: a PyTorch built without CUDA
        raise InputError(f"--device {args.device}: {_first_line(e)}") from None

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lib.pytorch_resnet import ResNet50Cifar

    types = {"F32": torch.float32, "F16": torch.float16, "I64": torch.int64}
    state = {}
    for name, (dtype, shape, raw) in tensors.items():
        try:
            key = pytorch_resnet_name(name)
        except ValueError as e:
            raise SafetensorsError(args.model, str(e)) from None
        state[key] = (torch.frombuffer(bytearray(raw), dtype=types[dtype]).reshape(shape) if raw
                      else torch.empty(shape, dtype=types[dtype]))  # frombuffer refuses an empty buffer
    model = ResNet50Cifar(num_classes=meta.classes)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:  # missing or unexpected tensors, or shapes that differ: one line, cut short
        problems = "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
        raise SafetensorsError(args.model, f"does not fit ResNet50Cifar(num_classes={meta.classes}) of "
                                           f"bench/lib/pytorch_resnet.py (its names): {problems[:400]}"
                                           f"{'...' if len(problems) > 400 else ''}") from None
    model.to(device).eval()

    images, labels, channels = test_set
    x = torch.frombuffer(bytearray(images), dtype=torch.uint8).reshape(len(labels), channels, meta.side, meta.side)
    mean = torch.tensor(meta.mean).view(1, MODEL_CHANNELS, 1, 1)
    std = torch.tensor(meta.std).view(1, MODEL_CHANNELS, 1, 1)
    predictions = []
    with torch.inference_mode():
        for i in range(0, len(labels), args.batch):
            batch = x[i:i + args.batch].float().div_(255).expand(-1, 3, -1, -1)  # grey: the one channel thrice
            logits = model(((batch - mean) / std).to(device))
            predictions += logits.argmax(1).tolist()
    correct = sum(p == t for p, t in zip(predictions, labels))
    print(f"accuracy: {100.0 * correct / len(labels):.2f}% ({correct:,} of {len(labels):,} test images of {meta.data}, "
          f"PyTorch {torch.__version__} on {device})")
    if theirs is not None:
        same = sum(a == b for a, b in zip(predictions, theirs))
        print(f"agreement with {args.compare_csv}: {100.0 * same / len(theirs):.2f}% ({same:,} of {len(theirs):,})")
    return 0


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def at_least_one(text: str) -> int:
    """argparse type of --batch: a whole number of at least 1 (a usage error, exit 2, otherwise)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a .safetensors file written by bin/predict --export")
    p.add_argument("--data-dir", help="where the test set's files are (default: where bin/train looks)")
    p.add_argument("--batch", type=at_least_one, default=256, help="images a forward pass (default 256)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--compare-csv", help="a predictions CSV of bin/predict over the same test set")
    args = p.parse_args(argv)
    try:
        return evaluate(args)
    except (InputError, DataError) as e:
        print(f"load_safetensors: error: {e}", file=sys.stderr)
    except OSError as e:  # one naming no file is not blamed on the model file
        print(f"load_safetensors: error: {e.filename}: {e.strerror}" if e.filename else f"load_safetensors: error: {e}",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
