"""PlaNet's episode replay buffer, kept on disk in the run folder so that a killed run loses
no experience: each finished episode is written as `episodes/<index>.npz` (to a temporary name,
then renamed: a file is whole or absent), and a resumed run loads them all.

An episode holds `observations [T + 1, ...]`, `actions [T + 1, action_dim]` (row 0 zeros: the
action before the first observation) and `rewards [T + 1]` (row 0 zero), so that row `t` pairs
the action taken before observation `t` with the reward it earned. Training draws `[batch,
length]` chunks uniformly over episodes and start positions, from a NumPy generator seeded by
the run's seed and the step: a resumed run draws the chunks the uninterrupted one would.
"""

import glob
import os
import zipfile

import numpy as np
from absl import logging

__all__ = ["EpisodeBuffer"]


class EpisodeBuffer:
    """Episodes of one run, in memory and under `directory`."""

    def __init__(self, directory):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        for stale in glob.glob(os.path.join(directory, "*.tmp.npz")):
            os.remove(stale)  # an episode whose write a kill interrupted
        self.episodes = []
        paths = sorted(glob.glob(os.path.join(directory, "*.npz")))
        for number, path in enumerate(paths):
            try:
                with np.load(path) as f:
                    self.episodes.append({k: f[k] for k in f.files})
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                # Episodes are numbered in collection order: this one and every later one are
                # set aside (kept as *.damaged), and the run collects from here again.
                later = paths[number:]
                for damaged in later:
                    os.replace(damaged, damaged + ".damaged")
                logging.warning(
                    "Episode file %s cannot be read (%s: %s); it and the %d later episode(s) "
                    "are kept as *.npz.damaged, and the run collects from episode %d again.",
                    path,
                    type(error).__name__,
                    str(error)[:200],
                    len(later) - 1,
                    number,
                )
                break

    def __len__(self):
        return len(self.episodes)

    @property
    def num_steps(self):
        return self.steps_in(len(self.episodes))

    def steps_in(self, episodes):
        """Agent steps in the first `episodes` episodes."""
        return sum(len(e["rewards"]) - 1 for e in self.episodes[:episodes])

    def add(self, observations, actions, rewards, **extra):
        """Appends one episode (see the module docstring for the layout) and writes it;
        `extra` arrays of the same rows (the true velocities, for the probe) are kept too."""
        episode = {
            "observations": np.asarray(observations, np.float32),
            "actions": np.asarray(actions, np.float32),
            "rewards": np.asarray(rewards, np.float32),
            **{k: np.asarray(v, np.float32) for k, v in extra.items()},
        }
        lengths = {len(v) for v in episode.values()}
        if len(lengths) != 1:
            raise ValueError(f"EpisodeBuffer.add: rows differ between fields: {lengths}.")
        index = len(self.episodes)
        final = os.path.join(self.directory, f"{index:06d}.npz")
        temporary = os.path.join(self.directory, f"{index:06d}.tmp.npz")
        np.savez_compressed(temporary, **episode)
        os.replace(temporary, final)
        self.episodes.append(episode)
        return index

    def truncate(self, count):
        """Keeps the first `count` episodes; later ones are set aside on disk as
        `*.npz.superseded` (kept, not deleted) and forgotten here."""
        for index in range(count, len(self.episodes)):
            path = os.path.join(self.directory, f"{index:06d}.npz")
            if os.path.exists(path):
                os.replace(path, path + ".superseded")
        del self.episodes[count:]

    def returns(self):
        """Each episode's total reward, in collection order."""
        return [float(e["rewards"].sum()) for e in self.episodes]

    def sample(self, batch_size, length, seed, step, episodes=None):
        """`(observations, actions, rewards)` of `batch_size` chunks of `length` rows, drawn
        by a generator seeded with `(seed, step)` from the first `episodes` episodes (default
        all: a resumed agent passes the count its step implies, so an episode collected after
        its checkpoint waits for its turn)."""
        pool = self.episodes[:episodes] if episodes is not None else self.episodes
        usable = [i for i, e in enumerate(pool) if len(e["rewards"]) >= length]
        if not usable:
            raise ValueError(f"EpisodeBuffer: no episode has {length} steps to sample.")
        rng = np.random.default_rng([seed, step])
        picks = rng.choice(usable, batch_size)
        chunks = {k: [] for k in ("observations", "actions", "rewards")}
        for i in picks:
            episode = self.episodes[i]
            start = rng.integers(0, len(episode["rewards"]) - length + 1)
            for key, rows in chunks.items():
                rows.append(episode[key][start : start + length])
        return tuple(np.stack(chunks[k]) for k in ("observations", "actions", "rewards"))
