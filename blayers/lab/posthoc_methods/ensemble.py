"""`--method=ensemble`: a deep ensemble of the run's model, its other members trained here as
replicas of one model, or other finished runs."""

import numpy as np

from blayers.lab import runs
from blayers.lab.posthoc_methods import Method


class Ensemble(Method):
    """The equal mixture of this run's predictive and other members' (a deep ensemble,
    Lakshminarayanan et al., 2017: the same model from other seeds).

    With `members` an integer `M` (default 5, the paper's), the `M - 1` other members are
    trained here: the run's own model builder, optimizer, batch size, KL schedule and number
    of steps, from seeds `run seed + 1, ..., run seed + M - 1`, all as replicas of one model
    (`blayers.replicas`: each follows the trajectory it has alone, in one graph at about the
    cost of one wider network). The builder must take `replicas=` (`mlp` and the UCI
    regressors do). With `members` a list of run folders (same model and data), those runs
    are mixed as they are.

    Args:
      members: the ensemble's size `M` (members trained here), or the other runs' folders.
    """

    name = "ensemble"

    def __init__(self, members=5):
        super().__init__()
        if isinstance(members, (int, np.integer)) and not isinstance(members, bool):
            if members < 2:
                raise ValueError(f"Ensemble.members must be at least 2, got {members}.")
            self.size, self.members = int(members), []
        elif (
            isinstance(members, (list, tuple))
            and members
            and all(isinstance(m, str) for m in members)
        ):
            self.size, self.members = len(members) + 1, list(members)
        else:
            raise ValueError(
                "Ensemble.members is the ensemble's size (an integer of at least 2: the other "
                "members are trained here) or the other runs' folders "
                f"(['RUN2', 'RUN3']); got {members!r}."
            )
        self.label = f"deep ensemble of {self.size}"

    def fit(self, fit):
        self.draws = [fit.base]
        if self.members:
            self._restore_members(fit)
        else:
            self._train_members(fit)

    def _restore_members(self, fit):
        from blayers.lab.posthoc import restore

        for member in self.members:
            try:
                learner, _ = restore(member)
            except runs.CheckpointMismatchError as error:
                raise ValueError(
                    f"posthoc: the ensemble member {member} is not a run of this model: "
                    f"{runs.first_line(error)}"
                ) from None
            self.draws.append(fit.predict(learner.model))

    def _train_members(self, fit):
        from blayers.lab.data.base import Replica
        from blayers.lab.data.replicas import Replicas
        from blayers.lab.learners.supervised import SupervisedLearner
        from blayers.lab.posthoc import build, train_in_memory

        run = fit.learner
        steps = int(run.step)
        seeds = [run.seed + m for m in range(1, self.size)]
        members = Replicas(
            [Replica(f"member{m}", run.data, s, ensemble="ensemble") for m, s in enumerate(seeds)]
        )
        learner = SupervisedLearner(
            data=members,
            model=run.model_fn,
            optimizer=run.optimizer_fn,
            batch_size=run.batch_size,
            kl_schedule=run.kl_schedule,
            num_eval_samples=run.num_eval_samples,
        )
        learner.check_bindings = False
        try:
            build(learner, run.seed, steps)
        except TypeError as error:
            if "replicas" not in str(error):
                raise
            raise ValueError(
                f"posthoc: Ensemble.members = {self.size} trains the other members as replicas "
                f"of the run's model, and its builder takes no replicas= argument ({error}). "
                "Train them as runs and pass their folders: Ensemble.members = ['RUN2', ...]."
            ) from None
        train_in_memory(learner, steps)
        count = len(seeds)
        params = fit.predict(learner.model, replicas=count)  # draw-major [draws x R, n, ...]
        by_draw = [p.reshape((-1, count) + p.shape[1:]) for p in params]
        self.draws += [[p[:, r] for p in by_draw] for r in range(count)]
        self.note(
            f"ensemble: {len(seeds)} members trained as replicas of one model ({steps} steps, "
            f"seeds {seeds[0]}-{seeds[-1]}), mixed with the run."
        )

    def predictive(self, fit):
        return [np.concatenate(parts) for parts in zip(*self.draws)]

    def metrics(self, fit):
        return {"ensemble_size": len(self.draws)}
