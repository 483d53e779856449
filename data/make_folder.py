#!/usr/bin/env python3
"""`make data-folder`: writes Fashion-MNIST (and CIFAR-10 when `make data` has fetched it) as image
folders of PNG files, the format of `bin/train --data folder`:

    data/fashion-mnist-png/train/<k>_<class>/<index>.png   60,000 files
    data/fashion-mnist-png/test/<k>_<class>/<index>.png    10,000 files
    data/cifar-10-png/{train,test}/...                      50,000 + 10,000 files

Each PNG holds exactly the pixels the array reader serves: Fashion-MNIST's 28x28 grey images on the
32x32 zero canvas (8-bit grey PNGs), CIFAR-10's 32x32 colour images (8-bit RGB PNGs). So at the
default --image-size 32 the folder reader sees the same pixels and labels as the idx/binary reader,
and the accuracies of the two can be compared. Class directories are prefixed with their label
(`0_T-shirt_top` ... `9_Ankle_boot`), so that their sorted order is the label order; <index> is the
image's position in its original file.

The source files are checked as bin/train's readers check them (each idx file's length against the
image count in its header, CIFAR-10's as whole records, the labels 0..9), all the files of both
splits of a set before any PNG of it is written, so that no malformed image is written and a bad
test file is found at once; a problem with them, or with --out, is one `data-folder: error:` line
and exit status 1.
A set is written into a temporary directory that is renamed at the end, and removed on any failure,
so that a failed or interrupted run leaves no half-written folder under the final name, which later
runs would take as done; a set already there is left alone. No third-party modules: the PNGs are
written with zlib.

    python3 data/make_folder.py [--out data] [--fashion-mnist-dir DIR] [--cifar-dir DIR] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "data") not in sys.path:  # for dataset_files when this file is imported, not run
    sys.path.insert(0, str(REPO / "data"))
from dataset_files import (CIFAR_RECORD, MNIST_SIDE, DataError, centre_on_canvas,  # noqa: E402  (data/,
                           find_fashion_mnist_dir, holds_fashion_mnist, read_cifar_batch,  # shared with bench/)
                           read_idx_pair)

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SIDE = 32


def png_bytes(width: int, height: int, channels: int, pixels: bytes) -> bytes:
    """An 8-bit grey (channels 1) or RGB (3) PNG of interleaved rows, filter 0 on every row."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    stride = width * channels
    raw = b"".join(b"\x00" + pixels[y * stride:(y + 1) * stride] for y in range(height))
    colour_type = 0 if channels == 1 else 2
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def class_dir(label: int, name: str) -> str:
    return f"{label}_" + name.replace("/", "_").replace(" ", "_")


def fashion_split(directory: Path, images: str, labels: str, limit: int | None):
    """(label, 32x32 grey pixels) of one idx pair, each 28x28 image centred on a zero canvas. Both files
    are read and checked here, when it is called; the images are made as the result is iterated."""
    count, img, lab = read_idx_pair(directory, images, labels)
    return _fashion_images(img, lab, count if limit is None else min(limit, count))


def _fashion_images(img: bytes, lab: bytes, count: int):
    for i in range(count):
        src = img[16 + i * MNIST_SIDE * MNIST_SIDE:16 + (i + 1) * MNIST_SIDE * MNIST_SIDE]
        yield lab[8 + i], centre_on_canvas(src, MNIST_SIDE, SIDE)


def cifar_split(directory: Path, files: list[str], limit: int | None):
    """(label, 32x32 RGB interleaved pixels) of CIFAR-10 batch files (label byte, R, G, B planes). The
    files are read and checked here, when it is called (with --limit, those it reaches); the images
    are made as the result is iterated."""
    batches, records = [], 0
    for name in files:
        if limit is not None and records >= limit:
            break
        batches.append(read_cifar_batch(directory / name))
        records += len(batches[-1]) // CIFAR_RECORD
    return _cifar_images(batches, records if limit is None else min(limit, records))


def _cifar_images(batches: list[bytes], count: int):
    records = (data[r * CIFAR_RECORD:(r + 1) * CIFAR_RECORD] for data in batches for r in range(len(data) // CIFAR_RECORD))
    for _, rec in zip(range(count), records):
        planes = [rec[1 + c * SIDE * SIDE:1 + (c + 1) * SIDE * SIDE] for c in range(3)]
        yield rec[0], bytes(v for p in zip(*planes) for v in p)


def write_set(out: Path, classes: list[str], channels: int, splits: dict) -> tuple[int, int]:
    """Writes each split's images into out (through out.tmp, removed on any failure, an interrupt
    included); returns the image counts."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        counts = []
        for split, items in splits.items():
            dirs = [tmp / split / class_dir(k, name) for k, name in enumerate(classes)]
            for d in dirs:
                d.mkdir(parents=True)
            n = 0
            for index, (label, pixels) in enumerate(items):
                (dirs[label] / f"{index:05d}.png").write_bytes(png_bytes(SIDE, SIDE, channels, pixels))
                n += 1
            counts.append(n)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts[0], counts[1]


def write_folders(args: argparse.Namespace) -> int:
    """Both sets' folders; a DataError or OSError stops it with nothing left under a set's final name."""
    if args.fashion_mnist_dir and not holds_fashion_mnist(args.fashion_mnist_dir):
        raise DataError(f"--fashion-mnist-dir {args.fashion_mnist_dir}: no train-images-idx3-ubyte(.gz) there")
    fashion = args.fashion_mnist_dir or find_fashion_mnist_dir(REPO / "data" / "fashion-mnist")
    if fashion is None:
        raise DataError("Fashion-MNIST not found: install the Debian package dataset-fashion-mnist "
                        "or pass --fashion-mnist-dir")
    out = args.out / "fashion-mnist-png"
    if out.exists():
        print(f"data-folder: {out} is already there")
    else:
        n, m = write_set(out, FASHION_CLASSES, 1, {
            "train": fashion_split(fashion, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", args.limit),
            "test": fashion_split(fashion, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", args.limit)})
        print(f"data-folder: wrote {n:,} train and {m:,} test PNGs of Fashion-MNIST (from {fashion}) to {out}")

    out = args.out / "cifar-10-png"
    if not (args.cifar_dir / "data_batch_1.bin").exists():
        print(f"data-folder: CIFAR-10 is not in {args.cifar_dir} (`make data` fetches it): not written")
    elif out.exists():
        print(f"data-folder: {out} is already there")
    else:
        n, m = write_set(out, CIFAR_CLASSES, 3, {
            "train": cifar_split(args.cifar_dir, [f"data_batch_{i}.bin" for i in range(1, 6)], args.limit),
            "test": cifar_split(args.cifar_dir, ["test_batch.bin"], args.limit)})
        print(f"data-folder: wrote {n:,} train and {m:,} test PNGs of CIFAR-10 (from {args.cifar_dir}) to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "data", help="where the folders go (data/)")
    p.add_argument("--fashion-mnist-dir", type=Path, help="the idx files (default: where bin/train looks)")
    p.add_argument("--cifar-dir", type=Path, default=REPO / "data" / "cifar-10-batches-bin",
                   help="CIFAR-10's binary batches (data/cifar-10-batches-bin); skipped when absent")
    p.add_argument("--limit", type=int, help="only the first N images of each split (for tests)")
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit must be at least 1, not {args.limit}")
    try:
        return write_folders(args)
    except DataError as e:
        print(f"data-folder: error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"data-folder: error: {e.filename}: {e.strerror}" if e.filename else f"data-folder: error: {e}",
              file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C: write_set has removed its temporary folder
        print("data-folder: error: interrupted; no folder was left half-written", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
