"""Kernel time per step by kind (bench/kernel_kinds.py), on recorded nsys cuda_gpu_kern_sum rows of
bin/train and of the PyTorch reference (tests/fixtures/nsys/kinds-*.csv)."""

import contextlib
import csv
import io
import unittest

from tests.python import FIXTURES

import kernel_kinds

TRAIN = FIXTURES / "nsys" / "kinds-train_cuda_gpu_kern_sum.csv"
TORCH = FIXTURES / "nsys" / "kinds-pytorch_cuda_gpu_kern_sum.csv"


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class KindOf(unittest.TestCase):
    def test_names_of_both_trainers_fall_in_their_kinds(self):
        cases = {
            "void xmma__5x_cudnn::gemm::warp_specialized_kernel_gmma_utmaldg<xmma__5x_cudnn::implicit_gemm::dgrad::"
            "Warp_specialized_gmma_dgrad_bn_stat_kernel_traits<...>": "convolutions and GEMMs",
            "void xmma__5x_cudnn::ext::batchnorm::bn_stats::dbn_stats_kernel<(int)32, ...>": "convolutions and GEMMs",
            "nvjet_sm90_hsh_64x64_64x13_1x2_h_bz_splitK_NTT": "convolutions and GEMMs",
            "void cublasLt::splitKreduce_kernel<(int)32, ...>": "convolutions and GEMMs",
            "void trainer_kernels::<unnamed>::apply_backward<__half, (Layout)1, (ReluMask)3, (bool)0, (bool)1>(...)":
                "batch norm, ReLU, residual add",
            "trainer_kernels::<unnamed>::finalize_sums(float *, float *, double, BnChannelState, int, __half *, __half *)":
                "batch norm, ReLU, residual add",
            "triton_poi_fused__native_batch_norm_legit_functional_add_convolution_backward_native_batch_norm_"
            "backward_threshold_backward_67": "batch norm, ReLU, residual add",
            "void trainer_kernels::<unnamed>::sgd_kernel<__half>(SgdArgs, unsigned long, const ScalerState *)":
                "optimizer step (SGD, gradient check)",
            "void at::native::<unnamed>::multi_tensor_apply_kernel<...BinaryOpListAlphaFunctor...>":
                "optimizer step (SGD, gradient check)",
            "trainer_kernels::<unnamed>::fill_regions_kernel(FillRegions)": "fills (buffers cuDNN expects zeroed)",
            "triton_poi_fused__to_copy_39": "casts and copies",
            "void trainer_kernels::<unnamed>::softmax_xent_kernel<__half>(float *, ...)": kernel_kinds.OTHER,
        }
        for name, kind in cases.items():
            with self.subTest(name=name[:60]):
                self.assertEqual(kernel_kinds.kind_of(name), kind)


class Split(unittest.TestCase):
    def test_every_row_is_counted_once(self):
        for path in (TRAIN, TORCH):
            with self.subTest(path=path.name):
                s = kernel_kinds.load(path)
                r = rows(path)
                self.assertEqual(sum(t.ns for t in s.values()), sum(int(x["Total Time (ns)"]) for x in r))
                self.assertEqual(sum(t.kernels for t in s.values()), sum(int(x["Instances"]) for x in r))
                self.assertEqual(sum(len(t.largest) for t in s.values()), len(r))

    def test_largest_kernel_of_a_kind_comes_first(self):
        s = kernel_kinds.load(TRAIN)["batch norm, ReLU, residual add"]
        self.assertEqual(s.largest[0][0], max(ns for ns, _, _ in s.largest))
        self.assertIn("apply_backward", s.largest[0][2])

    def test_a_file_without_the_table_is_refused(self):
        with self.assertRaisesRegex(ValueError, "no cuda_gpu_kern_sum table"):
            kernel_kinds.load(FIXTURES / "nsys" / "README.md")


class Table(unittest.TestCase):
    def test_per_step_columns_for_each_profile(self):
        text = kernel_kinds.table([("bin/train", kernel_kinds.load(TRAIN)),
                                   ("PyTorch", kernel_kinds.load(TORCH))], steps=100)
        lines = text.splitlines()
        self.assertIn("bin/train: µs a step", lines[0])
        self.assertIn("PyTorch: µs a step", lines[0])
        conv = next(l for l in lines if l.startswith("| convolutions and GEMMs |")).split("|")
        want_train = sum(int(x["Total Time (ns)"]) for x in rows(TRAIN)
                         if kernel_kinds.kind_of(x["Name"]) == "convolutions and GEMMs") / 100 / 1e3
        self.assertEqual(conv[2].strip(), f"{want_train:,.0f}")
        fills = next(l for l in lines if l.startswith("| fills")).split("|")
        self.assertEqual(fills[4].strip(), "0")  # PyTorch has none: a zero, not a missing cell
        self.assertTrue(lines[-1].startswith("| **all kernels** |"))

    def test_command_line(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = kernel_kinds.main(["--steps", "100", f"ours={TRAIN}", f"torch={TORCH}", "--by-kernel", "1"])
        self.assertEqual(rc, 0)
        self.assertIn("| **all kernels** |", out.getvalue())
        self.assertIn("sgd_kernel", out.getvalue())

    def test_bad_arguments_are_one_line_errors(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(kernel_kinds.main(["--steps", "100", f"x={FIXTURES / 'nsys' / 'missing.csv'}"]), 2)
        self.assertIn("kernel_kinds:", err.getvalue())
        for argv in (["--steps", "0", f"x={TRAIN}"], ["--steps", "100", str(TRAIN)]):
            with self.subTest(argv=argv), contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit) as e:
                    kernel_kinds.main(argv)
                self.assertEqual(e.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
