"""The data set files as bin/train finds them, for the Python scripts that read them outside it:
data/make_folder.py and bench/load_safetensors.py import this (standard library only), so both look
for Fashion-MNIST where bin/train --data auto looks, in its order.

Each script puts this folder on sys.path itself (by its own path), so it is found whether the script
runs as `python3 data/make_folder.py` or `python3 bench/load_safetensors.py`, or is imported by the
tests.
"""

from __future__ import annotations

import os
from pathlib import Path

FASHION_MNIST_PACKAGE_DIR = "/usr/share/datasets/fashion-mnist"  # the Debian package dataset-fashion-mnist


def fashion_mnist_dirs(local: str | Path = "data/fashion-mnist") -> list[str]:
    """Where bin/train looks for Fashion-MNIST, in its order (find_fashion_mnist_dir in
    src/data/fashion_mnist.cpp): $FASHION_MNIST_DIR when set, then data/fashion-mnist (`local`,
    relative to where the script runs, as bin/train takes it, unless a caller anchors it elsewhere),
    then the Debian package's directory, which $FASHION_MNIST_PACKAGE_DIR replaces when set and not
    empty, as in the Makefile and data/prepare.sh (the tests' stand-in for the package). An empty
    $FASHION_MNIST_DIR is passed over (bin/train would look for /train-images-idx3-ubyte.gz)."""
    first = [os.environ["FASHION_MNIST_DIR"]] if os.environ.get("FASHION_MNIST_DIR") else []
    return first + [str(local), os.environ.get("FASHION_MNIST_PACKAGE_DIR") or FASHION_MNIST_PACKAGE_DIR]


def holds_fashion_mnist(directory: str | Path) -> bool:
    """bin/train's test of a candidate: it holds train-images-idx3-ubyte, .gz or not."""
    return any((Path(directory) / f).exists() for f in ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"))


def find_fashion_mnist_dir(local: str | Path = "data/fashion-mnist") -> Path | None:
    """The first of fashion_mnist_dirs(local) that holds the training images, or None: the directory
    bin/train --data auto trains on."""
    return next((Path(d) for d in fashion_mnist_dirs(local) if holds_fashion_mnist(d)), None)
