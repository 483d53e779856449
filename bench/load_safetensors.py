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
import os
import re
import struct
import sys
from pathlib import Path

STAGE_BLOCKS = (3, 4, 6, 3)  # bottleneck blocks per stage, as pytorch_resnet.py builds them
DTYPES = {"F32": ("f", 4), "F16": ("e", 2), "I64": ("q", 8)}


def read_safetensors(path: str | Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict[str, str]]:
    """{name: (dtype, shape, raw little-endian bytes)} and the metadata, from the file's own layout."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        tensors[name] = (entry["dtype"], list(entry["shape"]), body[begin:end])
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
    the same files bin/train reads."""
    if data == "cifar10":
        path = Path(data_dir or "data/cifar-10-batches-bin") / "test_batch.bin"
        raw = path.read_bytes()
        records = [raw[i:i + 3073] for i in range(0, len(raw), 3073)]
        return b"".join(r[1:] for r in records), [r[0] for r in records], 3
    if data == "fashion-mnist":
        candidates = [data_dir] if data_dir else [os.environ.get("FASHION_MNIST_DIR"), "data/fashion-mnist",
                                                   "/usr/share/datasets/fashion-mnist"]
        for d in filter(None, candidates):
            images, labels = _idx(Path(d), "t10k-images-idx3-ubyte", 16), _idx(Path(d), "t10k-labels-idx1-ubyte", 8)
            if images is not None and labels is not None:
                return _pad_to_32(images, 28), list(labels), 1
        raise SystemExit(f"error: Fashion-MNIST test files not found in {', '.join(filter(None, candidates))}")
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
    try:
        import torch  # only here: reading and mapping work without it
    except ImportError:
        raise SystemExit("error: evaluating needs PyTorch (pip install torch); reading the file and mapping its "
                         "names do not") from None

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pytorch_resnet import ResNet50Cifar

    tensors, meta = read_safetensors(args.model)
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
    return evaluate(args)


if __name__ == "__main__":
    sys.exit(main())
