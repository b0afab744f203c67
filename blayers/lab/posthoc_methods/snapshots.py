"""`--method=snapshots`: the equal mixture of the run's kept checkpoints (snapshot and checkpoint
ensembles)."""

import os

from blayers.lab.posthoc_methods import Method
from blayers.lab.runs.files import checkpoint_number, checkpoint_prefixes


def _learning_rates(learner, steps):
    """The run schedule's first rate and the rate of the update that ended at each of `steps`
    (a snapshot's is near 0: the end of its cycle), or None for a constant rate."""
    import keras

    schedule = getattr(getattr(learner, "optimizer", None), "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return None
    return float(schedule(0)), [float(schedule(max(step - 1, 0))) for step in steps]


class Snapshots(Method):
    """A snapshot ensemble (Huang et al., ICLR 2017) from one run: the predictives of the run's
    kept checkpoints, mixed with equal weight. With a cyclic learning rate whose cycles end at
    the checkpoints (`make_optimizer.schedule = @cosine_decay_restarts` with
    `cosine_decay_restarts.first_decay_steps = train.checkpoint_every`, `t_mul = 1.0` and
    `m_mul = 1.0`, and `train.keep_checkpoints = M`) each checkpoint is a converged model of its
    own cycle, the paper's snapshots (`configs/digits_snapshots.gin`); with a plain schedule it
    is a checkpoint ensemble of the last `M` checkpoints. The note gives the learning rate of
    each member's last step, so a cycle that does not end at a checkpoint shows, and the label
    says which it is: "snapshot ensemble (M cycles)" when every member's last rate is under 1%
    of the schedule's first, "checkpoint ensemble (last M)" otherwise.

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
        note = f"snapshots: checkpoints of steps {sorted(self.steps)} mixed with equal weight"
        rates = _learning_rates(learner, sorted(self.steps))
        cycle_ends = False
        if rates:
            first, last = rates
            note += "; their last steps' learning rates " + ", ".join(f"{r:.3g}" for r in last)
            cycle_ends = max(last) < 0.01 * first  # each member converged at a cycle's end
        n = len(self.draws)
        self.label = (
            f"snapshot ensemble ({n} cycles)" if cycle_ends else f"checkpoint ensemble (last {n})"
        )
        self.note(note + ".")

    def predictive(self, fit):
        import numpy as np

        return [np.concatenate(parts) for parts in zip(*self.draws)]

    def metrics(self, fit):
        return {"ensemble_size": len(self.draws)}
