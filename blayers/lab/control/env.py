"""dm_control suite tasks as PlaNet sees them: action repeat, a fixed episode length, and
observations that are 64x64 RGB renders (scaled to [-0.5, 0.5]) or the task's state vector.

The simulator runs in a child process (`dm_control_worker.py`): MuJoCo's EGL rendering crashes a
process that has loaded TensorFlow (measured here: a segmentation fault at the first render).
Needs the `control` extra (`pip install -e '.[control]'`: `dm-control` and `mujoco==3.17.0`;
dm-control 1.0.50 does not run on mujoco 4). Pixels render headless through MuJoCo's EGL
backend (`MUJOCO_GL=egl` unless the user chose another), which needs the system's `libEGL`
(Mesa's `libegl1` on Debian and Ubuntu); state observations render nothing.
"""

import importlib.util
import os
import subprocess
import sys
import weakref

import gin
import numpy as np

from blayers.lab.control import dm_control_worker

__all__ = ["ControlEnv"]


@gin.configurable("control_env", module="blayers.lab.control")
class ControlEnv:
    """One dm_control task, simulated in a child process (in gin: `@control_env()`).

    Args:
      domain, task: the suite's names (`'cheetah', 'run'`; `'cartpole', 'balance'`).
      observation: `'pixels'` (`[size, size, 3]` float32 in [-0.5, 0.5]) or `'state'` (the
        observation dict's arrays, flattened and concatenated).
      action_repeat: environment steps per agent action (rewards summed).
      episode_steps: agent steps per episode (PlaNet: 1000 environment steps / repeat).
      size: render height and width.
      camera: the suite's camera id.
      seed: the task's random state (initial positions).
    """

    def __init__(
        self,
        domain="cheetah",
        task="run",
        observation="pixels",
        action_repeat=4,
        episode_steps=250,
        size=64,
        camera=0,
        seed=0,
    ):
        if observation not in ("pixels", "state"):
            raise ValueError(
                f"control_env.observation must be 'pixels' or 'state', got {observation!r}."
            )
        if importlib.util.find_spec("dm_control") is None:
            raise ImportError(
                "Control tasks need dm_control and MuJoCo: pip install -e '.[control]' "
                "(dm-control, mujoco==3.17.0)."
            )
        self.name = f"{domain}-{task}"
        self.observation_mode, self.action_repeat = observation, int(action_repeat)
        self.episode_steps, self.size = int(episode_steps), int(size)
        environment = dict(os.environ)
        # Rendering needs EGL; a state task renders nothing and must not need libEGL.
        environment.setdefault("MUJOCO_GL", "egl" if observation == "pixels" else "disable")
        self._gl = environment["MUJOCO_GL"]
        self._process = subprocess.Popen(
            [sys.executable, "-u", dm_control_worker.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
        )
        # Ends the simulator when this object goes, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _stop, self._process)
        specs = self._call(
            "init",
            {
                "domain": domain,
                "task": task,
                "observation": observation,
                "size": self.size,
                "camera": camera,
                "seed": seed,
            },
        )
        self.action_dim = int(np.prod(specs["action_shape"]))
        self.action_low, self.action_high = specs["action_low"], specs["action_high"]
        self.observation_shape = (
            (self.size, self.size, 3) if observation == "pixels" else (specs["state_size"],)
        )

    def _call(self, command, argument=None):
        try:
            dm_control_worker._write(self._process.stdin, (command, argument))
            reply = dm_control_worker._read(self._process.stdout)
        except (BrokenPipeError, OSError):
            reply = None
        if reply is None:
            code = self._process.poll()
            raise RuntimeError(
                f"The {self.name} simulator process ended (exit code {code}) during {command!r}"
                + self._render_hint()
            )
        status, value = reply
        if status == "error" and value.startswith("ValueError: control_env:"):
            self.close()
            raise ValueError(value[len("ValueError: ") :])  # a bad binding: one clear line
        if status == "error":
            raise RuntimeError(f"{self.name} {command}: {value}" + self._render_hint())
        return value

    def _render_hint(self):
        if self.observation_mode != "pixels":
            return "."
        return (
            f". Rendering uses MUJOCO_GL={self._gl}: headless EGL needs the system's libEGL "
            "(apt install libegl1), or use control_env.observation = 'state'."
        )

    def _observation(self, raw):
        if self.observation_mode == "pixels":
            return np.asarray(raw, np.float32) / 255.0 - 0.5
        return np.asarray(raw, np.float32)

    def velocity(self):
        """The physics' generalized velocities (the probe's regression target)."""
        return self._call("velocity")

    def reset(self, seed=None):
        """The first observation of an episode; with `seed`, its initial state is a function
        of the seed alone (a resumed run replays the uninterrupted run's episodes)."""
        self._steps = 0
        return self._observation(self._call("reset", None if seed is None else int(seed)))

    def step(self, action):
        """`(observation, reward, done)` after `action_repeat` environment steps."""
        action = np.clip(np.asarray(action, np.float64), self.action_low, self.action_high)
        raw, reward, last = self._call("step", (action, self.action_repeat))
        self._steps += 1
        done = last or self._steps >= self.episode_steps
        return self._observation(raw), float(reward), done

    def close(self):
        """Ends the simulator process (also done when the object is collected, or at exit)."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


def _stop(process):
    if process.poll() is None:
        try:
            dm_control_worker._write(process.stdin, ("close", None))
            process.wait(timeout=10)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            process.kill()
