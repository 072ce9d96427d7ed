"""kotune's klue_dp metric family as an evaluate module: see tasks/evaluate_metrics/__init__.py."""
import evaluate

from tasks.evaluate_metrics import KotuneMetric


class KlueDp(KotuneMetric, evaluate.Metric):
    family = "klue_dp"
