"""Model-based control (paper Section 3.2, Bayesian PlaNet): `env` (dm_control tasks with
action repeat, pixels or states), `buffer` (episodes on disk), `planner` (the cross-entropy
method in latent space) and `planet` (the agent's trainer)."""
