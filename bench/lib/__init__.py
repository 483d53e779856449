"""What the bench tools on top of bench/ share: running the binaries (runner) and the ranks of a
data-parallel run (ranks: on one machine, or as machines simulated on it), the images/s table
(table, chart), profiles from nsys or the built-in trace (capture, nsys_summary, trace_summary,
timeline), and the PyTorch reference's rungs, model and input pipelines (pytorch_rungs, pytorch_resnet,
pytorch_data).

The tools run as `python3 bench/<tool>.py`, which puts bench/ on sys.path, and import these as
`from lib import runner`; inside the package the modules import each other relatively.
"""
