"""DRAM and L2 bytes a step by kernel kind (bench/kernel_bytes.py), on ncu's --csv output of one
training step's first kernels at batch 256 on an H200 (tests/fixtures/ncu/train-step-b256-h200.csv:
kernels 0-15, layer1.0's conv1 data gradient and SGD, as ncu wrote them)."""

import contextlib
import csv
import io
import tempfile
import unittest
from pathlib import Path

from tests.python import FIXTURES

import kernel_bytes

STEP = FIXTURES / "ncu" / "train-step-b256-h200.csv"


def fixture_rows():
    with open(STEP) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("==")))


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kernel_bytes.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


class ReadKernels(unittest.TestCase):
    def test_each_kernel_once_with_its_bytes_and_time(self):
        kernels = kernel_bytes.read_kernels(STEP.read_text())
        rows = fixture_rows()
        self.assertEqual(len(kernels), len({r["ID"] for r in rows}))
        self.assertEqual(len(kernels), 18)
        # The fixture's bytes are in bytes and its times in ns: added up here without the tool's units.
        dram = sum(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"].startswith("dram__bytes"))
        ns = sum(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == "gpu__time_duration.sum")
        self.assertAlmostEqual(sum(k.dram for k in kernels), dram)
        self.assertAlmostEqual(sum(k.us for k in kernels), ns / 1000)
        sgd = [k for k in kernels if "sgd_kernel" in k.name]
        self.assertEqual(len(sgd), 1)
        self.assertAlmostEqual(sgd[0].dram / 1e6, 466.6, delta=0.1)  # fp32 weights and momentum, fp16 gradients

    def test_units_are_read_as_ncu_names_them(self):
        head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
        lines = [head, '"0","k","dram__bytes_read.sum","Kbyte","1,500"', '"0","k","dram__bytes_write.sum","Mbyte","2"',
                 '"0","k","lts__t_bytes.sum","Gbyte","0.5"', '"0","k","gpu__time_duration.sum","usecond","12.5"']
        (k,) = kernel_bytes.read_kernels("\n".join(lines))
        self.assertEqual((k.dram, k.l2, k.us), (1.5e6 + 2e6, 0.5e9, 12.5))

    def test_what_is_not_ncus_table_is_refused_with_what_is_wrong(self):
        text = STEP.read_text()
        lines = text.splitlines()
        first_l2 = next(i for i, line in enumerate(lines) if "lts__t_bytes.sum" in line)
        header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
        row = lines[header + 1]
        cases = {
            "Name,Total Time (ns)\nx,5\n": "no ncu --csv metrics table",
            # one kernel (the first) without its L2 bytes, the others whole
            "\n".join(lines[:first_l2] + lines[first_l2 + 1:]): r"kernel 0 \(void trainer_kernels::<unnamed>::normalize_kernel.*\) "
                                                              r"lacks lts__t_bytes.sum",
            "\n".join(lines + [row]): "table row 92: kernel 0 given twice",  # two runs' rows in one file
            "\n".join(lines[:header + 1] + ['"0","1544"'] + lines[header + 1:]): "table row 2 has too few cells",
            # bin/train's own output in the file (ncu's CSV sent to stdout, not --log-file)
            "\n".join(lines[:header + 1] + ["data: synthetic from (generated): 50000 train, 10000 test images, 32x32, "
                                            "3 channels, mean 0.5000 std 0.2898"] + lines[header + 1:]):
                r"table row 2: kernel ID 'data: synthetic from \(generated\): 50000 train' is not a number",
            "\n".join(lines[:header + 1] + ['"0","' + "x" * 200_000]): "not ncu's CSV: field larger than field limit",
            text.replace('"byte","796,160"', '"byte","-796,160"', 1): "'-796160' is not a number of bytes",
        }
        for bad, want in cases.items():
            with self.subTest(want=want[:40]), self.assertRaisesRegex(ValueError, want):
                kernel_bytes.read_kernels(bad)


class Tables(unittest.TestCase):
    def test_the_kinds_add_up_to_the_total_and_divide_by_the_steps(self):
        code, out, err = run("--steps", 2, STEP)
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        body = [line.split(" | ") for line in lines[2:-1]]
        total = lines[-1].split(" | ")
        self.assertTrue(total[0].startswith("| **all kernels**"))
        kernels = kernel_bytes.read_kernels(STEP.read_text())
        self.assertEqual(float(total[1].replace(",", "")), round(sum(k.dram for k in kernels) / 2 / 1e6))
        self.assertEqual(float(total[3]), 9.0)  # 18 kernels over 2 steps
        self.assertAlmostEqual(sum(float(r[1].replace(",", "")) for r in body), float(total[1].replace(",", "")), delta=len(body))
        kinds = [r[0].lstrip("| ") for r in body]
        self.assertIn("batch norm, ReLU, residual add", kinds)
        self.assertIn("optimizer step (SGD, gradient check)", kinds)

    def test_each_cell_of_a_kind_from_its_kernels(self):
        # The fixture's one SGD and one finite check are the optimizer kind: compute its row by hand.
        kernels = [k for k in kernel_bytes.read_kernels(STEP.read_text()) if "sgd_kernel" in k.name or "check_finite" in k.name]
        self.assertEqual(len(kernels), 1)  # the fixture holds SGD but not the check
        sgd = kernels[0]
        code, out, _ = run("--steps", 2, STEP)
        (line,) = [line for line in out.splitlines() if line.startswith("| optimizer step")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        self.assertEqual(cells[1:], [f"{sgd.dram / 2e6:,.0f}", f"{sgd.l2 / 2e6:,.0f}", "0.5", f"{sgd.us / 2:,.0f}",
                                     f"{sgd.dram / sgd.us / 1e3:,.0f}"])
        self.assertEqual(cells[1:], ["233", "447", "0.5", "67", "3,502"])  # ncu's own numbers: 466.6 MB, 894.7 MB, 133.2 µs

    def test_a_bom_is_not_part_of_the_first_column(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "bom.csv"
            path.write_bytes(b"\xef\xbb\xbf" + STEP.read_bytes().split(b"\n", 3)[3])  # the notices cut: the header first
            code, out, err = run("--steps", 1, path)
            self.assertEqual((code, err), (0, ""))
            self.assertIn("| **all kernels** |", out)

    def test_by_kernel_lists_the_most_dram_bytes_first(self):
        code, out, _ = run("--steps", 1, "--by-kernel", 3, STEP)
        self.assertEqual(code, 0)
        listed = [line for line in out.splitlines() if line.startswith("| `")]
        self.assertEqual(len(listed), 3)
        mb = [float(line.split(" | ")[1].replace(",", "")) for line in listed]
        self.assertEqual(mb, sorted(mb, reverse=True))
        self.assertIn("BnGradEpilogue", listed[0])  # layer1.0's conv1 data gradient: 589 MB
        # the forward's two StatsEpilogue launches of the fixture counted as one name
        self.assertTrue(any("StatsEpilogue" in line and "| 2.0 |" in line for line in listed), listed)

    def test_sort_l2_lists_the_most_l2_bytes_first(self):
        # two kernels whose orders differ: "dram-heavy" moves more DRAM bytes, "l2-heavy" more L2 bytes
        header = ('"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"')
        lines = [header]
        for kid, name, dram, l2 in (("0", "dram-heavy", "9,000,000", "10,000,000"),
                                    ("1", "l2-heavy", "1,000,000", "50,000,000")):
            for metric, unit, number in (("dram__bytes_read.sum", "byte", dram), ("dram__bytes_write.sum", "byte", "0"),
                                         ("lts__t_bytes.sum", "byte", l2), ("gpu__time_duration.sum", "ns", "1,000")):
                lines.append(f'"{kid}","1","{name}","{metric}","{unit}","{number}"')
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "two.csv"
            path.write_text("\n".join(lines) + "\n")
            for sort, first, title in (("dram", "dram-heavy", "DRAM"), ("l2", "l2-heavy", "L2")):
                with self.subTest(sort=sort):
                    code, out, _ = run("--steps", 1, "--by-kernel", 2, "--sort", sort, path)
                    self.assertEqual(code, 0)
                    self.assertIn(f"The 2 kernels that move the most {title} bytes:", out)
                    listed = [line for line in out.splitlines() if line.startswith("| `")]
                    self.assertTrue(listed[0].startswith(f"| `{first}`"), listed)


class BadInput(unittest.TestCase):
    def test_each_is_one_line_and_a_non_zero_exit(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            binary = d / "binary.csv"
            binary.write_bytes(b"\xff\xfe\x00garbage")
            text = STEP.read_text()
            inf = d / "inf.csv"
            inf.write_text(text.replace('"byte","796,160"', '"byte","inf"', 1))
            unit = d / "unit.csv"
            unit.write_text(text.replace('"byte","796,160"', '"furlong","796,160"', 1))
            cases = [(d / "none.csv", 2, "No such file"), (binary, 2, "not a text file"),
                     (inf, 1, "dram__bytes_read.sum: 'inf' is not a number of bytes"),
                     (unit, 1, "unit 'furlong' is not one of")]
            for path, want_code, want in cases:
                with self.subTest(path=path.name):
                    code, out, err = run("--steps", 1, path)
                    self.assertEqual((code, out), (want_code, ""))
                    self.assertEqual(len(err.splitlines()), 1, err)
                    self.assertTrue(err.startswith(f"kernel_bytes: {path}: "), err)
                    self.assertIn(want, err)

    def test_steps_and_by_kernel_are_checked(self):
        for args in (["--steps", "0", str(STEP)], ["--steps", "1", "--by-kernel", "-1", str(STEP)],
                     ["--steps", "1", "--by-kernel", "3", "--sort", "time", str(STEP)]):
            with self.subTest(args=args), contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as e:
                kernel_bytes.main(args)
            self.assertEqual(e.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
