"""A dm_control task in a process of its own, driven over stdin/stdout by `ControlEnv`.

MuJoCo's EGL rendering (Mesa) crashes a process that has loaded TensorFlow (a segmentation
fault at the first render, `free(): invalid pointer` at exit: both bring their own LLVM), so
the simulator runs here, in a Python that never imports TensorFlow (PlaNet's own code ran its
environments in external processes too). This file is run as a script, not imported through
the `blayers` package, whose import loads TensorFlow.

Protocol: length-prefixed pickles. Requests `(command, argument)`; replies `("ok", value)` or
`("error", message)`. Commands: `init` (kwargs: domain, task, observation, size, camera, seed;
returns the specs), `reset` (an optional seed), `step` (an action and a repeat count; returns observation, summed reward, last),
`velocity`, `close`.
"""

import os
import pickle
import struct
import sys


def _read(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _write(stream, value):
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


class _Task:
    def __init__(self, domain, task, observation, size, camera, seed):
        import numpy as np
        from dm_control import suite

        self.np = np
        if (domain, task) not in suite.ALL_TASKS:
            known = sorted({d for d, _ in suite.ALL_TASKS})
            tasks = sorted(t for d, t in suite.ALL_TASKS if d == domain)
            raise ValueError(
                f"control_env: dm_control has no task {domain}-{task}; "
                + (
                    f"{domain}'s tasks are {', '.join(tasks)}."
                    if tasks
                    else f"its domains are {', '.join(known)}."
                )
            )
        self.env = suite.load(domain, task, task_kwargs={"random": seed})
        self.observation, self.size, self.camera = observation, size, camera
        spec = self.env.action_spec()
        shapes = [tuple(s.shape) for s in self.env.observation_spec().values()]
        self.specs = {
            "action_shape": tuple(spec.shape),
            "action_low": np.asarray(spec.minimum, np.float64),
            "action_high": np.asarray(spec.maximum, np.float64),
            "state_size": int(sum(int(np.prod(s)) for s in shapes)),
        }

    def observe(self, time_step):
        np = self.np
        if self.observation == "pixels":
            return self.env.physics.render(self.size, self.size, camera_id=self.camera)
        return np.concatenate(
            [np.asarray(v, np.float32).ravel() for v in time_step.observation.values()]
        )

    def reset(self, seed=None):
        if seed is not None:  # the episode's initial state, a function of `seed` alone
            self.env.task.random.seed(seed)
        return self.observe(self.env.reset())

    def step(self, action, repeat):
        """`repeat` simulator steps with `action`, one observation at the end (one render)."""
        reward = 0.0
        for _ in range(repeat):
            time_step = self.env.step(action)
            reward += float(time_step.reward or 0.0)
            if time_step.last():
                break
        return self.observe(time_step), reward, bool(time_step.last())

    def velocity(self):
        return self.np.asarray(self.env.physics.data.qvel, self.np.float32).copy()


def main():
    # Run as a script, this folder is sys.path[0]; its module names must not shadow others.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the replies
    task = None
    while True:
        request = _read(requests)
        if request is None or request[0] == "close":
            return
        command, argument = request
        try:
            if command == "init":
                task = _Task(**argument)
                value = task.specs
            elif command == "reset":
                value = task.reset(argument)
            elif command == "step":
                value = task.step(*argument)
            elif command == "velocity":
                value = task.velocity()
            else:
                raise ValueError(f"unknown command {command!r}")
            _write(replies, ("ok", value))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
            _write(replies, ("error", f"{type(error).__name__}: {error}"))


if __name__ == "__main__":
    main()
