"""kotune's klue_ner metric family as an evaluate module: see tasks/evaluate_metrics/__init__.py."""
import evaluate

from tasks.evaluate_metrics import KotuneMetric


class KlueNer(KotuneMetric, evaluate.Metric):
    family = "klue_ner"
