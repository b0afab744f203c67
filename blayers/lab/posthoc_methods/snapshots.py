"""`--method=snapshots`: the equal mixture of the run's kept checkpoints (snapshot and checkpoint
ensembles)."""

import os

from blayers.lab.posthoc_methods import Method
from blayers.lab.runs.files import checkpoint_number, checkpoint_prefixes


class Snapshots(Method):
    """A snapshot ensemble (Huang et al., ICLR 2017) from one run: the predictives of the run's
    kept checkpoints, mixed with equal weight. With a cyclic learning rate whose cycles end at
    the checkpoints (`make_optimizer.schedule = @cosine_decay_restarts` with
    `cosine_decay_restarts.first_decay_steps = train.checkpoint_every`, and
    `train.keep_checkpoints = M`) each checkpoint is a converged model of its own cycle, the
    paper's snapshots (`configs/digits_snapshots.gin`); with a plain schedule it is a checkpoint
    ensemble of the last `M` checkpoints.

    Args:
      max_members: the newest checkpoints used at most (None: every kept one up to the scored
        step).
    """

    name, label = "snapshots", "snapshot ensemble"

    def __init__(self, max_members=None):
        super().__init__()
        if max_members is not None and (not isinstance(max_members, int) or max_members < 2):
            raise ValueError(
                f"Snapshots.max_members must be an int >= 2 or None, got {max_members!r}."
            )
        self.max_members = max_members

    def fit(self, fit):
        learner = fit.learner
        scored = getattr(learner, "scored_checkpoint_path", None)
        if scored is None:
            raise ValueError("posthoc: snapshots needs a restored run (its checkpoint folder).")
        step = checkpoint_number(scored)
        prefixes = [
            p for p in checkpoint_prefixes(os.path.dirname(scored)) if checkpoint_number(p) <= step
        ]
        prefixes = prefixes[: self.max_members] if self.max_members else prefixes
        if len(prefixes) < 2:
            raise ValueError(
                f"posthoc: snapshots needs at least 2 kept checkpoints; the run holds "
                f"{len(prefixes)} (train.keep_checkpoints and train.checkpoint_every set them)."
            )
        state = learner.state()
        self.draws, self.steps = [fit.base], [step]
        try:
            for prefix in prefixes[1:]:
                state.read(prefix)
                self.draws.append(fit.predict(fit.model))
                self.steps.append(checkpoint_number(prefix))
        finally:
            state.read(scored)  # the run's model left as restored
        self.note(f"snapshots: checkpoints of steps {sorted(self.steps)} mixed with equal weight.")

    def predictive(self, fit):
        import numpy as np

        return [np.concatenate(parts) for parts in zip(*self.draws)]

    def metrics(self, fit):
        return {"ensemble_size": len(self.draws)}
