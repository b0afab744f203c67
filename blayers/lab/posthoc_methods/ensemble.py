"""`--method=ensemble`: the run mixed with other finished runs of the same model."""

import numpy as np

from blayers.lab import runs
from blayers.lab.posthoc_methods import Method


class Ensemble(Method):
    """The equal mixture of this run's predictive and the other runs' (a deep ensemble,
    Lakshminarayanan et al., 2017, when they are the same model trained from other seeds).

    Args:
      members: the other runs' folders (same model and data).
    """

    name = "ensemble"

    def __init__(self, members=()):
        super().__init__()
        if not members:
            raise ValueError(
                "posthoc: method 'ensemble' needs the other runs: "
                "--gin_param=\"Ensemble.members = ['RUN2', 'RUN3']\"."
            )
        self.members = list(members)
        self.label = f"deep ensemble of {len(self.members) + 1}"

    def fit(self, fit):
        from blayers.lab.posthoc import restore

        self.draws = [fit.base]
        for member in self.members:
            try:
                learner, _ = restore(member)
            except runs.CheckpointMismatchError as error:
                raise ValueError(
                    f"posthoc: the ensemble member {member} is not a run of this model: "
                    f"{runs.first_line(error)}"
                ) from None
            self.draws.append(fit.predict(learner.model))

    def predictive(self, fit):
        return [np.concatenate(parts) for parts in zip(*self.draws)]

    def metrics(self, fit):
        return {"ensemble_size": len(self.draws)}
