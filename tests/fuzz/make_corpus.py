#!/usr/bin/env python3
"""Writes a small seed corpus of valid inputs for each fuzz target (so mutations start from files
that parse), into the directory given: <dir>/<target>/seed-N."""
import gzip
import os
import struct
import sys
import zlib


def idx_pair(n):
    images = struct.pack(">IIII", 0x803, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 784))
    labels = struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))
    return images, labels


def checkpoint(params, running, ema=False):
    """Format version 1, or with `ema` version 2 (the weight average of --ema after the others)."""
    header = (f"precision=fp32\nlayout=NCHW\nmodel=resnet50-cifar\nmodel_signature=42\nparams={params}\n"
              f"running={running}\ndata=synthetic\nbatch=8\nepochs=1\nseed=0\nstep=3\nepoch=0\nstep_in_epoch=3\n"
              f"loss_scale=0x1p+0\ngood_steps=0\nskipped_steps=0\n" + ("ema_decay=0x1p-1\n" if ema else "")).encode()
    body = b"RN50CKPT" + struct.pack("<II", 2 if ema else 1, len(header)) + header
    for count in (params, params, running) + ((params,) if ema else ()):
        body += struct.pack("<Q", count) + struct.pack(f"<{count}f", *[0.5 * i for i in range(count)])
    return body + struct.pack("<I", zlib.crc32(body))


def main(out):
    seeds = {
        "cifar10": [bytes([0]) + bytes([3]) + bytes(range(256)) * 12, bytes([1]) + (bytes([9]) + bytes(3072)) * 2],
        "idx": [],
        "gunzip": [gzip.compress(b"hello fuzz" * 50), gzip.compress(bytes(range(256)) * 8)],
        "checkpoint": [checkpoint(4, 2), checkpoint(0, 0), checkpoint(4, 2, ema=True)],
        "autotune_cache": [b"resnet-trainer autotune cache v2\n[gpu=X;cudnn=91400;precision=fp16;layout=NHWC]\n"
                           b"n8.c64.h32.w32.k64.r3.s1.p1 fwd=1/1/0/0.5 bwd_data=1/1/0/0.25 bwd_filter=0/0/4096/-1\n"
                           b"n8.c64.h32.w32.k64.r1.s1.p0 fwd=eng62_k2=4_k25=1/0/0/0.5 bwd_data=eng67/0/0/0.25 "
                           b"bwd_filter=eng1_k3=-1/0/4096/-1\n"
                           b"fused.conv-bn.n8.c64.h32.w32.k64.r1.s1.p0 plan=eng31_k2=1/1/0/0.0541 unfused=0.0612\n"],
        "options": [b"--batch\x00256\x00--lr=0.05\x00--no-eval", b"--data\x00synthetic\x00--steps\x0010\x00--json"],
        "predict_options": [b"--checkpoint\x00m.ckpt\x00--features\x00f.npy\x00--features-dtype=float16",
                            b"--checkpoint=m\x00--export\x00m.safetensors\x00--top-k\x003"],
    }
    for n in (1, 3):
        images, labels = idx_pair(n)
        seeds["idx"].append(struct.pack(">H", len(images)) + images + labels)
    # Every format of the image fixtures, each behind the byte that picks the side and channels.
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "images")
    seeds["image_folder"] = [bytes([i * 37 % 256]) + open(os.path.join(fixtures, name), "rb").read()
                             for i, name in enumerate(sorted(os.listdir(fixtures))) if not name.endswith(".py")]
    for target, items in seeds.items():
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        for i, data in enumerate(items):
            with open(os.path.join(d, f"seed-{i}"), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
