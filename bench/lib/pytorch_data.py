"""Random CIFAR-shaped data for the PyTorch reference, fed the two ways the rungs compare.

- HostDataset: uint8 images in host memory, augmented one image at a time on the CPU (random crop,
  horizontal flip, normalize), batched by a DataLoader: the usual PyTorch input pipeline.
- GpuResidentData: the whole set as uint8 on the GPU, a batch drawn and augmented with a handful of
  batched tensor ops: no loader, no host-to-device copy per step.
Both produce float32 NCHW batches of the images' own side, normalized with given channel statistics
(CIFAR-10's by default; bench/pytorch_train.py passes Fashion-MNIST's). The random crop pads each edge
by crop_pad(side) zero pixels and takes a window of the image's side: pad-4 at 32x32.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the PyTorch reference's input pipelines), not a program: "
          "run python3 bench/pytorch_reference.py", file=sys.stderr)
    sys.exit(2)

import random

import torch
import torch.nn.functional as F

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def crop_pad(side: int) -> int:
    """bin/train's crop_pad_for (include/data/augment.h): side / 8, 4 at 32x32 (the CIFAR recipe's
    pad-4 crop) and the same shift relative to the image at any other side (3 at 28x28)."""
    return side // 8


def random_images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """count uint8 3x32x32 images and labels 0-9, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (count,), generator=g)
    return images, labels


class HostDataset(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean=MEAN, std=STD, pad: int | None = None):
        self.images, self.labels = images, labels
        self.side = images.shape[-1]
        self.pad = crop_pad(self.side) if pad is None else pad  # bin/train's --crop-pad
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        # DataLoader seeds `random` per worker, so workers do not repeat each other's crops.
        pad = self.pad
        x = F.pad(self.images[i].float().div_(255), (pad, pad, pad, pad))
        dy, dx = random.randint(0, 2 * pad), random.randint(0, 2 * pad)
        x = x[:, dy:dy + self.side, dx:dx + self.side]
        if random.random() < 0.5:
            x = x.flip(2)
        return (x - self.mean) / self.std, self.labels[i]


class GpuResidentData:
    """Draws shuffled batches from images kept on the GPU and augments them there. On several ranks
    (rank of world) every rank draws the same permutation (the same seed) and takes its slice of each
    global batch of batch x world images, as bin/train shards an epoch."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch: int, device: torch.device,
                 mean=MEAN, std=STD, rank: int = 0, world: int = 1, pad: int | None = None):
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.batch = batch
        self.rank, self.world = rank, world
        self.device = device
        self.side = images.shape[-1]
        self.pad = crop_pad(self.side) if pad is None else pad
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        self.order = torch.randperm(len(labels), device=device)
        self.pos = 0
        self.base = torch.arange(self.side, device=device)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.batch * self.world  # the global batch
        if self.pos + step > len(self.order):  # new epoch: reshuffle, drop the ragged tail
            self.order = torch.randperm(len(self.order), device=self.device)
            self.pos = 0
        first = self.pos + self.rank * self.batch
        idx = self.order[first:first + self.batch]
        self.pos += step
        pad = self.pad
        x = F.pad(self.images[idx].float().div_(255), (pad, pad, pad, pad))
        b = len(idx)
        # Random crop and flip of each image as one gather: row and column indices per image.
        dy = torch.randint(0, 2 * pad + 1, (b, 1), device=self.device)
        dx = torch.randint(0, 2 * pad + 1, (b, 1), device=self.device)
        flip = torch.rand(b, 1, device=self.device) < 0.5
        s = self.side
        rows = dy + self.base
        cols = torch.where(flip, dx + s - 1 - self.base, dx + self.base)
        n = torch.arange(b, device=self.device).view(b, 1, 1, 1)
        c = torch.arange(3, device=self.device).view(1, 3, 1, 1)
        x = x[n, c, rows.view(b, 1, s, 1), cols.view(b, 1, 1, s)]
        return (x - self.mean) / self.std, self.labels[idx]
