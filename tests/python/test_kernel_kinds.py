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


def kind(prefix: str) -> str:
    """The full name of the kind whose name starts with `prefix`."""
    (name,) = [k for k in kernel_kinds.ORDER if k.startswith(prefix)]
    return name


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class KindOf(unittest.TestCase):
    def test_names_of_both_trainers_fall_in_their_kinds(self):
        cases = {
            "void xmma__5x_cudnn::gemm::warp_specialized_kernel_gmma_utmaldg<xmma__5x_cudnn::implicit_gemm::dgrad::"
            "Warp_specialized_gmma_dgrad_bn_stat_kernel_traits<...>": kind("conv"),
            "void xmma__5x_cudnn::ext::batchnorm::bn_stats::dbn_stats_kernel<(int)32, ...>": kind("conv"),
            "nvjet_sm90_hsh_64x64_64x13_1x2_h_bz_splitK_NTT": kind("conv"),
            "void trainer_kernels::resident_conv<trainer_kernels::ResidentConv<(int)128, (int)64, (bool)1, (bool)1, "
            "trainer_kernels::StatsEpilogue>>(T1::Params)": kind("conv"),
            "void cublasLt::splitKreduce_kernel<(int)32, ...>": kind("conv"),
            # our other convs: the data gradients with their weight gradients, their parts' sum, the stem's
            "void trainer_kernels::resident_dgrad_wgrad<(int)4, trainer_kernels::BnGradEpilogue<(int)1, "
            "layout::RowMajor>, (int)1>(T2)": kind("conv"),
            "trainer_kernels::<unnamed>::dw_from_partials_kernel(const float *, float *, int, int)": kind("conv"),
            "void trainer_kernels::<unnamed>::stem_forward_kernel<(int)64>(StemParams)": kind("conv"),
            "trainer_kernels::<unnamed>::stem_wgrad_partials(StemParams)": kind("conv"),
            "trainer_kernels::<unnamed>::stem_wgrad_reduce(const float *, float *, int, int)": kind("conv"),
            "trainer_kernels::<unnamed>::turn_filter_kernel(const __half *, __half *, int, int)": kind("casts"),
            "void trainer_kernels::<unnamed>::apply_backward<__half, (Layout)1, (ReluMask)3, (bool)0, (bool)1>(...)":
                kind("batch norm"),
            "trainer_kernels::<unnamed>::finalize_sums(float *, float *, double, BnChannelState, int, __half *, __half *)":
                kind("batch norm"),
            "trainer_kernels::<unnamed>::eval_coefs_all(const BnEvalTarget *)": kind("batch norm"),
            "trainer_kernels::<unnamed>::fold_filters(const FilterFold *)": kind("batch norm"),
            "nvjet_sm90_hsh_64x384_64x3_2x1_v_bx_coopB_relubias_TNT": kind("conv"),
            "triton_poi_fused__native_batch_norm_legit_functional_add_convolution_backward_native_batch_norm_"
            "backward_threshold_backward_67": kind("batch norm"),
            "void trainer_kernels::<unnamed>::sgd_kernel<__half>(SgdArgs, unsigned long, const ScalerState *)":
                kind("optimizer"),
            "void at::native::<unnamed>::multi_tensor_apply_kernel<...BinaryOpListAlphaFunctor...>":
                kind("optimizer"),
            "trainer_kernels::<unnamed>::fill_regions_kernel(FillRegions)": kind("fills"),
            "triton_poi_fused__to_copy_39": kind("casts"),
            "void trainer_kernels::<unnamed>::softmax_xent_kernel<__half>(float *, ...)": kernel_kinds.OTHER,
            # PyTorch's: BN statistics whose names end in copy_ (the running statistics) are BN ...
            "triton_per_fused__native_batch_norm_legit_functional_copy__37": kind("batch norm"),
            "triton_poi_fused_add_threshold_backward_63": kind("batch norm"),
            # ... its foreach copies are not the optimizer, and "nocast" kernels are not casts
            "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int)2>, "
            "at::native::<unnamed>::UnaryOpFunctor<float, (int)2, (int)1, (int)1>, at::native::Copy<float, float>>(T1)":
                kind("casts"),
            "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<"
            "at::native::CUDAFunctor_add<long>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)":
                kernel_kinds.OTHER,
            "triton_poi_fused_add_copy__61": kind("casts"),
            # fills: ours, PyTorch's, and cuDNN's workspace set-up (xmma in its name, not a conv)
            "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
            "std::array<char *, (unsigned long)1>>(int, T2, T3)": kind("fills"),
            "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::"
            "wgrad_indexed::Warp_specialized_gmma_bn_apply_kernel_traits<...>>(T1::Params)": kind("fills"),
        }
        for name, want in cases.items():
            with self.subTest(name=name[:60]):
                self.assertEqual(kernel_kinds.kind_of(name), want)


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
        s = kernel_kinds.load(TRAIN)[kind("batch norm")]
        self.assertEqual(s.largest[0][0], max(ns for ns, _, _ in s.largest))
        self.assertIn("apply_backward", s.largest[0][2])

    def test_a_file_without_the_table_is_refused(self):
        with self.assertRaisesRegex(ValueError, "no cuda_gpu_kern_sum table"):
            kernel_kinds.load(FIXTURES / "nsys" / "README.md")

    def test_other_nsys_reports_are_refused(self):
        for report in ("train-devloss_cuda_api_sum.csv", "train-devloss_nvtx_sum.csv",
                       "train-devloss_cuda_gpu_mem_time_sum.csv"):
            with self.subTest(report=report), self.assertRaisesRegex(ValueError, "no cuda_gpu_kern_sum table"):
                kernel_kinds.load(FIXTURES / "nsys" / report)

    def test_rows_in_any_order_give_the_largest_first(self):
        r = list(reversed(rows(TRAIN)))  # the report's order is longest first: reversed, shortest first
        s = kernel_kinds.split(r)
        for k, t in s.items():
            with self.subTest(kind=k):
                times = [ns for ns, _, _ in t.largest]
                self.assertEqual(times, sorted(times, reverse=True))


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
        opt = next(l for l in lines if l.startswith("| optimizer")).split("|")
        # bin/train's fixture: sgd_kernel 167.1 µs and check_finite_kernel 22.1 µs a step, one launch each
        self.assertEqual([c.strip() for c in opt[2:4]], ["189", "2.0"])
        total = lines[-1].split("|")
        self.assertTrue(lines[-1].startswith("| **all kernels** |"))
        want = sum(int(x["Total Time (ns)"]) for x in rows(TORCH)) / 100 / 1e3
        self.assertEqual(total[4].strip(), f"{want:,.0f}")
        self.assertEqual(total[5].strip(), f"{sum(int(x['Instances']) for x in rows(TORCH)) / 100:,.1f}")

    def test_by_kernel_lists_at_most_n_a_kind(self):
        lines = kernel_kinds.largest_lines("ours", kernel_kinds.load(TRAIN), steps=100, n=1)
        per_kind = [l for l in lines if l.startswith("    ")]
        self.assertEqual(len(per_kind), len([l for l in lines if l.startswith("  ") and not l.startswith("    ")]))
        self.assertIn("apply_backward", "\n".join(per_kind))  # the largest BN kernel, not the second
        self.assertNotIn("apply_forward<__half, (Layout)1, (bool)1, (Residual)1>", "\n".join(per_kind))

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
        for argv in (["--steps", "0", f"x={TRAIN}"], ["--steps", "100", str(TRAIN)],
                     ["--steps", "100", "--by-kernel", "-1", f"x={TRAIN}"]):
            with self.subTest(argv=argv), contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit) as e:
                    kernel_kinds.main(argv)
                self.assertEqual(e.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
