"""kotune's klue_re metric family as an evaluate module: see tasks/evaluate_metrics/__init__.py."""
import evaluate

from tasks.evaluate_metrics import KotuneMetric


class KlueRe(KotuneMetric, evaluate.Metric):
    family = "klue_re"
