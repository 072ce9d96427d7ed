"""kotune's command line: ``python run.py task=nli model=klue`` (Hydra; see conf/ and kotune/).

compose config → read task data → tokenizer + encoder + head → transformers.Trainer → decode →
KLUE metrics → ``results.json`` (atomic) in the run directory, plus the model and predictions.
"""
import os

if __name__ == "__main__":
    # Idle OpenMP threads sleep rather than spin (read when torch loads, so set before). On a CPU
    # shared with other jobs, or by torchrun processes, spinning threads that lose their core
    # stall every op: measured 2.6x slower BERT-base steps on a busy 2-core machine, a few % the
    # other way on an idle one. An explicit OMP_WAIT_POLICY wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from kotune.cli import run

    run()
