"""Benchmarks, run from the repository root as ``python -m bench.<name>`` (see each script's docstring).
The scripts share helper modules and never import one another: bench.common (measuring), bench.stats
(paired statistics over seeds), bench.jobs (one in-process job), bench.pretraining (the pretraining
benches' recipe and protocol), bench.hate_speech (the hate-speech fine-tuning benches' options); and
bench.throughput_* are bench.throughput's parts (its data, runner, same-science checks, report)."""
