"""Reproduction 'scale': the third document's scale-invariance claims (docs/METHODS.md).

ReLU + LayerNorm MLPs on digits in three residual variants (none, post-norm, pre-norm; see
:mod:`headrank.training.batched`), trained with SGD over a λ grid and an η·λ = const group, and
with AdamW (variant none). Every minibatch gets fresh Gaussian input noise: without it the net
interpolates the 1,300 training images, the gradient noise dies out and the equilibrium that the
predictions (angular update √(2ηλ/(1+β)), norm ‖W‖² = η E‖g‖²/(2λ(1−β)); AdamW ‖W‖ ∝ √(η/λ))
describe never forms (the full profile reports that case in a note).

Parts: :mod:`.params` (profiles), :mod:`.experiment` (``run``), :mod:`.claims`, :mod:`.figures`,
:mod:`.notes`.
"""

from headrank.studies.registry import CATALOGUE, Study, register_study
from headrank.studies.scale.claims import claims as judge
from headrank.studies.scale.experiment import run as run_experiment
from headrank.studies.scale.figures import figures as draw
from headrank.studies.scale.notes import notes as prose
from headrank.studies.scale.params import ScaleParams

STUDY = register_study(Study(
    name="scale", title=CATALOGUE["scale"][1],
    source="Dar 2023, 'Weight decay is useless without residual connections'",
    params=ScaleParams, run=run_experiment, claims=judge, figures=draw, notes=prose))

__all__ = ["STUDY", "ScaleParams"]
