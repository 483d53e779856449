#!/usr/bin/env python3
"""Loads a model exported by `bin/predict --export FILE.safetensors` into the PyTorch model of
bench/pytorch_resnet.py and evaluates it on the test set it was trained on.

    python3 bench/load_safetensors.py model.safetensors                      # data found as bin/train finds it
    python3 bench/load_safetensors.py model.safetensors --data-dir DIR --compare-csv predictions.csv

The file holds torchvision-style names (conv1, bn1, layer1.0.conv2, layer2.0.downsample.0, fc, the
names bin/train's parameters have); pytorch_resnet.py names the same modules stem.0, stem.1,
blocks.N and shortcut.0/1, so each name is mapped (pytorch_resnet_name()). The input normalisation
(mean and std per channel of the training set) comes from the file's metadata. Prints the accuracy
and, with --compare-csv, how often PyTorch's prediction equals bin/predict's.

Reading the file and mapping the names need only the standard library (the tests run them without
PyTorch); evaluating needs torch.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import struct
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
if str(DATA) not in sys.path:
    sys.path.insert(0, str(DATA))
from dataset_files import fashion_mnist_dirs, find_fashion_mnist_dir  # noqa: E402  (data/, shared with make_folder.py)

STAGE_BLOCKS = (3, 4, 6, 3)  # bottleneck blocks per stage, as pytorch_resnet.py builds them
DTYPES = {"F32": ("f", 4), "F16": ("e", 2), "I64": ("q", 8)}


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file; str() names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem


def read_safetensors(path: str | Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict[str, str]]:
    """{name: (dtype, shape, raw little-endian bytes)} and the metadata, from the file's own layout.

    Every entry is checked against the file (a known dtype, a shape of non-negative integers, offsets in
    order within the body, spanning exactly element size x product(shape) bytes), so a truncated or
    damaged file raises SafetensorsError (naming the file and the problem) instead of giving short
    tensors. A file that cannot be read raises OSError."""
    data = Path(path).read_bytes()
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


def read_test_set(data: str, data_dir: str | None) -> tuple[bytes, list[int], int]:
    """uint8 images (count x channels x 32 x 32), labels and channels of the test split, read from
    the same files bin/train reads: Fashion-MNIST's t10k files from --data-dir, else from the directory
    bin/train --data auto trains on (find_fashion_mnist_dir)."""
    if data == "cifar10":
        path = Path(data_dir or "data/cifar-10-batches-bin") / "test_batch.bin"
        raw = path.read_bytes()
        records = [raw[i:i + 3073] for i in range(0, len(raw), 3073)]
        return b"".join(r[1:] for r in records), [r[0] for r in records], 3
    if data == "fashion-mnist":
        directory = Path(data_dir) if data_dir else find_fashion_mnist_dir()
        if directory is None:
            raise SystemExit(f"error: Fashion-MNIST not found in {', '.join(fashion_mnist_dirs())}")
        images, labels = _idx(directory, "t10k-images-idx3-ubyte", 16), _idx(directory, "t10k-labels-idx1-ubyte", 8)
        if images is None or labels is None:
            raise SystemExit(f"error: Fashion-MNIST test files not found in {directory}")
        return _pad_to_32(images, 28), list(labels), 1
    raise SystemExit(f"error: the model was trained on {data!r}; only cifar10 and fashion-mnist have a test set to "
                     "evaluate on (synthetic data is random)")


def _idx(directory: Path, stem: str, header: int) -> bytes | None:
    for path, opener in ((directory / f"{stem}.gz", gzip.open), (directory / stem, open)):
        if path.is_file():
            with opener(path, "rb") as f:
                return f.read()[header:]
    return None


def _pad_to_32(images: bytes, side: int) -> bytes:
    """Each side x side image at the centre of a 32 x 32 zero canvas, as the trainer stores it."""
    pad, out = (32 - side) // 2, bytearray()
    for i in range(0, len(images), side * side):
        canvas = bytearray(32 * 32)
        for y in range(side):
            row = (y + pad) * 32 + pad
            canvas[row:row + side] = images[i + y * side:i + (y + 1) * side]
        out += canvas
    return bytes(out)


def predicted_column(path: str) -> list[int]:
    with open(path, newline="") as f:
        return [int(row["predicted"]) for row in csv.DictReader(f)]


def evaluate(args: argparse.Namespace) -> int:
    tensors, meta = read_safetensors(args.model)  # checked first, so a bad file is reported with or without torch
    for key in ("classes", "data", "input_mean", "input_std"):
        if key not in meta:
            raise SafetensorsError(args.model, f"no {key!r} in __metadata__ (not written by bin/predict --export?)")
    try:
        import torch  # only here: reading and mapping work without it
    except ImportError:
        raise SystemExit("error: evaluating needs PyTorch (pip install torch); reading the file and mapping its "
                         "names do not") from None

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pytorch_resnet import ResNet50Cifar

    types = {"F32": torch.float32, "F16": torch.float16, "I64": torch.int64}
    state = {pytorch_resnet_name(name): torch.frombuffer(bytearray(raw), dtype=types[dtype]).reshape(shape)
             for name, (dtype, shape, raw) in tensors.items()}
    model = ResNet50Cifar(num_classes=int(meta["classes"]))
    model.load_state_dict(state, strict=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device).eval()

    images, labels, channels = read_test_set(meta["data"], args.data_dir)
    x = torch.frombuffer(bytearray(images), dtype=torch.uint8).reshape(len(labels), channels, 32, 32)
    mean = torch.tensor(json.loads(meta["input_mean"])).view(1, 3, 1, 1)
    std = torch.tensor(json.loads(meta["input_std"])).view(1, 3, 1, 1)
    predictions = []
    with torch.inference_mode():
        for i in range(0, len(labels), args.batch):
            batch = x[i:i + args.batch].float().div_(255).expand(-1, 3, -1, -1)  # grey: the one channel thrice
            logits = model(((batch - mean) / std).to(device))
            predictions += logits.argmax(1).tolist()
    correct = sum(p == t for p, t in zip(predictions, labels))
    print(f"accuracy: {100.0 * correct / len(labels):.2f}% ({correct:,} of {len(labels):,} test images of {meta['data']}, "
          f"PyTorch {torch.__version__} on {device})")
    if args.compare_csv:
        theirs = predicted_column(args.compare_csv)
        if len(theirs) != len(predictions):
            raise SystemExit(f"error: {args.compare_csv} has {len(theirs)} rows, the test set {len(predictions)}")
        same = sum(a == b for a, b in zip(predictions, theirs))
        print(f"agreement with {args.compare_csv}: {100.0 * same / len(theirs):.2f}% ({same:,} of {len(theirs):,})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a .safetensors file written by bin/predict --export")
    p.add_argument("--data-dir", help="where the test set's files are (default: where bin/train looks)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--compare-csv", help="a predictions CSV of bin/predict over the same test set")
    args = p.parse_args(argv)
    try:
        return evaluate(args)
    except SafetensorsError as e:
        print(f"load_safetensors: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"load_safetensors: error: {args.model if e.filename is None else e.filename}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
