"""bin/train's --resume errors: a missing, corrupt, huge or FIFO file, and checkpoints of another model,
build, batch, data set or data size, or with a damaged header; each exit 1 with one "error: ..." line
naming the file, before the GPU is looked for."""

import math
import os
import re
import struct
import subprocess
import unittest
import zlib

from tests.python.cli_harness import SYNTHETIC, TRAIN, TrainCliHarness


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(TrainCliHarness, unittest.TestCase):
    # ---- --resume files: missing, corrupt, huge, not a regular file ------------------------------

    def test_missing_resume_file_exits_1_naming_it(self):
        missing = self.dir / "missing.ckpt"
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(missing))
        line = self.assert_one_error_line(p, 1, str(missing))
        self.assertNotIn("CUDA", line)

    def test_corrupt_resume_file_exits_1_naming_it(self):
        bad = self.dir / "bad.ckpt"
        bad.write_bytes(b"RN50CKPT" + b"\x01\x00\x00\x00" + b"\xff" * 10)
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(bad))
        line = self.assert_one_error_line(p, 1, str(bad))
        self.assertNotIn("CUDA", line)

    def test_a_huge_resume_file_is_too_large_at_once(self):
        for size in (12 << 30, 40 << 30):
            huge = self.dir / "huge.ckpt"
            with open(huge, "wb") as f:
                f.write(b"RN50CKPT")
                f.truncate(size)
            p = self.run_train(*SYNTHETIC, "--resume", str(huge))
            self.assert_one_error_line(p, 1, f"{huge}: too large: {size} bytes")

    def test_a_fifo_given_to_resume_is_refused_not_waited_on(self):
        fifo = self.dir / "resume.ckpt"
        os.mkfifo(fifo)
        p = self.run_train(*SYNTHETIC, "--resume", str(fifo), timeout=60)
        self.assert_one_error_line(p, 1, f"{fifo}: is a FIFO (named pipe), expected a regular file")

    # ---- checkpoints: compatibility and damage, all before the GPU -------------------------------

    def resume(self, path, *extra):
        return self.run_train(*SYNTHETIC, *extra, "--resume", str(path))

    def test_a_checkpoint_of_another_model_is_refused_before_the_gpu(self):
        small = write_checkpoint(self.dir / "other.ckpt", header(params=3, running=2, signature=42), 3, 2)
        self.assert_one_error_line(self.resume(small), 1, "checkpoint of another model")

    def test_another_precision_batch_data_or_data_size_is_refused_before_the_gpu(self):
        precision, layout = this_build()
        other = {"fp32": "fp16", "fp16": "fp32"}[precision]
        ckpt = self.dir / "run.ckpt"
        params, running, signature = resnet50_params()
        fits = dict(params=params, running=running, signature=signature, precision=precision, layout=layout,
                    data="synthetic", batch=32)
        cases = [
            (dict(fits, precision=other), f"written by a {other}/{layout} build"),
            (dict(fits, batch=64), "trained with --batch 64"),
            (dict(fits, data="cifar10"), "trained on cifar10; resume with --data cifar10"),
            # step 100 = epoch 1 x 95 + 5: a run of 95 steps per epoch, but 256 images / 32 give 8
            (dict(fits, step=100, epoch=1, step_in_epoch=5), "does not fit this run's 8 steps per epoch"),
        ]
        for fields, expected in cases:
            with self.subTest(expected=expected):
                write_checkpoint(ckpt, header(**fields), params, running)
                line = self.assert_one_error_line(self.resume(ckpt), 1, str(ckpt), expected)
                self.assertNotIn("CUDA", line)
        # The same file, fitting, gets as far as the GPU: the checks above are what refused it.
        write_checkpoint(ckpt, header(**fits), params, running)
        self.assert_one_error_line(self.resume(ckpt), 1, "no CUDA device")

    def test_a_corrupt_header_is_told_from_a_truncated_file(self):
        bad = write_checkpoint(self.dir / "bad.ckpt", header(params=13759268650546400843, running=2), 3, 2)
        line = self.assert_one_error_line(self.resume(bad), 1, f"{bad}: corrupt header")
        self.assertNotIn("truncated", line)
        cut = write_checkpoint(self.dir / "cut.ckpt", header(params=1000, running=20), 1000, 20)
        with open(cut, "r+b") as f:
            f.truncate(os.path.getsize(cut) - 100)
        self.assert_one_error_line(self.resume(cut), 1, f"{cut}: truncated")

    def test_step_epoch_and_step_in_epoch_are_checked_against_each_other(self):
        bad = write_checkpoint(self.dir / "pos.ckpt", header(params=3, running=2, step=100, epoch=3, step_in_epoch=5),
                               3, 2)
        self.assert_one_error_line(self.resume(bad), 1, f"{bad}: inconsistent header: step 100 is not epoch 3")


def this_build():
    """(precision, layout) of bin/train, from its --help."""
    out = subprocess.run([str(TRAIN), "--help"], capture_output=True, text=True).stdout
    m = re.search(r"-> (fp32|fp16), (NCHW|NHWC)", out)
    return m.group(1), m.group(2)


# The checkpoint format of include/train/checkpoint.h, written independently, and the model signature
# of src/train/checkpoint.cpp (model_signature) over ResNet-50's parameters, so that a test can make a
# checkpoint that fits this trainer's model and differs in one thing only.
MASK = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _mix(a, b):
    return _splitmix64(a ^ _splitmix64((b + 0x632BE59BD9B4E019) & MASK))


def resnet50_params(classes=10):
    """(parameter count, BN running statistics count, model signature) of ResNet-50 (CIFAR stem)."""
    tensors = [("conv1.weight", [64, 3, 3, 3]), ("bn1.weight", [64]), ("bn1.bias", [64])]
    in_c = 64
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for i in range(blocks):
            p, out_c = f"layer{stage + 1}.{i}.", width * 4
            for conv, shape, bn, channels in (("conv1", [width, in_c, 1, 1], "bn1", width),
                                              ("conv2", [width, width, 3, 3], "bn2", width),
                                              ("conv3", [out_c, width, 1, 1], "bn3", out_c)):
                tensors += [(p + conv + ".weight", shape), (p + bn + ".weight", [channels]), (p + bn + ".bias", [channels])]
            if i == 0:
                tensors += [(p + "downsample.0.weight", [out_c, in_c, 1, 1]), (p + "downsample.1.weight", [out_c]),
                            (p + "downsample.1.bias", [out_c])]
            in_c = out_c
    tensors += [("fc.weight", [classes, in_c]), ("fc.bias", [classes])]
    h, params, running = 0x5EED, 0, 0
    for name, shape in tensors:
        for ch in name.encode():
            h = _mix(h, ch)
        for d in shape:
            h = _mix(h, d + 0x100)
        params += math.prod(shape)
        if name.endswith(".bias") and not name.startswith("fc"):
            running += 2 * shape[0]
    return params, running, h


def header(params, running, signature=0, precision="fp32", layout="NCHW", data="synthetic", batch=32, step=0,
           epoch=0, step_in_epoch=0):
    return (f"precision={precision}\nlayout={layout}\nmodel=resnet50-cifar\nmodel_signature={signature}\n"
            f"params={params}\nrunning={running}\ndata={data}\nbatch={batch}\nepochs=15\nseed=0\nstep={step}\n"
            f"epoch={epoch}\nstep_in_epoch={step_in_epoch}\nloss_scale=0x1p+0\ngood_steps=0\nskipped_steps=0\n")


def write_checkpoint(path, header_text, params, running):
    """A checkpoint of zero-valued arrays: magic, version 1, header, three length-prefixed float32
    arrays, CRC-32 of everything before it."""
    head = header_text.encode()
    crc = 0
    with open(path, "wb") as f:
        def put(chunk):
            nonlocal crc
            crc = zlib.crc32(chunk, crc)
            f.write(chunk)
        put(b"RN50CKPT" + struct.pack("<II", 1, len(head)) + head)
        zeros = bytes(1 << 22)
        for count in (params, params, running):
            put(struct.pack("<Q", count))
            left = 4 * count
            while left:
                put(zeros[:min(left, len(zeros))])
                left -= min(left, len(zeros))
        f.write(struct.pack("<I", crc))
    return path


if __name__ == "__main__":
    unittest.main()
