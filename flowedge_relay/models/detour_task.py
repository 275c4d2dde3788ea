"""The toy robot task the shipped policies learn, and how to score an action chunk on it.

A 2-D point robot at `current` must reach `goal`; a disk obstacle sits exactly midway, so the
straight line (which is also the average of the demonstrations) always collides. Demonstrations
detour left or right around it, 50/50: the action distribution has two modes, and a flow policy
has to commit to one of them per sample rather than regress to their mean.

Kept in the package (not in `tools/`) because the trainer, the tests, the bench and producers all
need the same definition of observations, demonstrations and task error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OBS_DIM = 4  # [current_x, current_y, goal_x, goal_y]
ACTION_HORIZON = 8  # waypoints in one action chunk
ACTION_DIM = 2  # each waypoint is (x, y) relative to the current position
OBSTACLE_RADIUS = 0.3  # disk centred midway between current and goal
DISTANCE_RANGE = (1.2, 2.0)  # |goal - current|
DETOUR_RANGE = (0.5, 0.6)  # lateral offset of the demo path at the obstacle (> radius)
GOAL_TOLERANCE = 0.1  # a chunk "reaches" the goal when its last waypoint is this close

DESCRIPTION = (
    "2-D point robot. Observation [current_x, current_y, goal_x, goal_y]: current uniform in "
    f"[-1, 1]^2, goal at distance U{DISTANCE_RANGE} in a uniform direction. A disk obstacle of "
    f"radius {OBSTACLE_RADIUS} sits midway. Action chunk: {ACTION_HORIZON} waypoints x "
    f"{ACTION_DIM} = positions relative to current, the last one at the goal. Demonstrations "
    "bend around the obstacle on the left or on the right (50/50, lateral offset "
    f"U{DETOUR_RANGE} x sin(pi s)), so the conditional mean (the straight line) collides: "
    "the policy must pick one mode per sample."
)


def sample_observations(rng: np.random.Generator, n: int) -> np.ndarray:
    """n observations, float32 [n, OBS_DIM]."""
    current = rng.uniform(-1.0, 1.0, size=(n, 2))
    heading = rng.uniform(0.0, 2.0 * np.pi, size=n)
    dist = rng.uniform(*DISTANCE_RANGE, size=n)
    goal = current + dist[:, None] * np.stack([np.cos(heading), np.sin(heading)], axis=1)
    return np.concatenate([current, goal], axis=1).astype(np.float32)


def _progress() -> np.ndarray:
    return np.arange(1, ACTION_HORIZON + 1, dtype=np.float64) / ACTION_HORIZON


def demonstrations(
    rng: np.random.Generator, observations: np.ndarray, side: np.ndarray | None = None
) -> np.ndarray:
    """One demo chunk per observation, float32 [n, HORIZON * DIM]; random sides unless given."""
    obs = observations.astype(np.float64)
    n = obs.shape[0]
    if side is None:
        side = rng.choice(np.array([-1.0, 1.0]), size=n)
    amplitude = rng.uniform(*DETOUR_RANGE, size=n)
    delta = obs[:, 2:] - obs[:, :2]
    normal = np.stack([-delta[:, 1], delta[:, 0]], axis=1) / np.linalg.norm(delta, axis=1)[:, None]
    s = _progress()
    lateral = (side * amplitude)[:, None] * np.sin(np.pi * s)[None, :]
    way = s[None, :, None] * delta[:, None, :] + lateral[:, :, None] * normal[:, None, :]
    return way.reshape(n, -1).astype(np.float32)


def straight_line(observations: np.ndarray) -> np.ndarray:
    """The conditional mean of the demonstrations (both modes averaged): a mean baseline."""
    obs = observations.astype(np.float64)
    delta = obs[:, 2:] - obs[:, :2]
    way = _progress()[None, :, None] * delta[:, None, :]
    return way.reshape(obs.shape[0], -1).astype(np.float32)


@dataclass(frozen=True)
class TaskScore:
    """Per-chunk scores on the detour task."""

    goal_error: np.ndarray  # |last waypoint - goal|
    collided: np.ndarray  # bool: some path segment enters the obstacle disk
    side: np.ndarray  # +1 passes the obstacle on the left, -1 on the right, 0 neither

    @property
    def success(self) -> np.ndarray:
        return (self.goal_error < GOAL_TOLERANCE) & ~self.collided

    def summary(self) -> dict[str, float]:
        return {
            "mean_goal_error": float(self.goal_error.mean()),
            "collision_rate": float(self.collided.mean()),
            "success_rate": float(self.success.mean()),
            "left_fraction": float((self.side > 0).mean()),
        }


def score(observations: np.ndarray, actions: np.ndarray) -> TaskScore:
    """Score chunks [n, HORIZON * DIM] (relative waypoints) against their observations."""
    obs = observations.astype(np.float64)
    n = obs.shape[0]
    way = actions.astype(np.float64).reshape(n, ACTION_HORIZON, ACTION_DIM)
    path = np.concatenate([np.zeros((n, 1, 2)), way], axis=1)  # relative to current
    delta = obs[:, 2:] - obs[:, :2]
    centre = 0.5 * delta
    a, b = path[:, :-1], path[:, 1:]
    seg = b - a
    seg_len2 = np.maximum((seg * seg).sum(axis=2), 1e-12)
    u = np.clip(((centre[:, None, :] - a) * seg).sum(axis=2) / seg_len2, 0.0, 1.0)
    closest = a + u[:, :, None] * seg
    dist = np.linalg.norm(closest - centre[:, None, :], axis=2)
    collided = (dist < OBSTACLE_RADIUS).any(axis=1)
    goal_error = np.linalg.norm(way[:, -1] - delta, axis=1)
    # Which side of the goal line the waypoint nearest the obstacle lies on (sign of the cross
    # product): a consistent detour is on one side; the straight line is on neither.
    mid = way[:, ACTION_HORIZON // 2 - 1] - centre
    cross = delta[:, 0] * mid[:, 1] - delta[:, 1] * mid[:, 0]
    lateral = cross / np.linalg.norm(delta, axis=1)
    side = np.where(lateral > OBSTACLE_RADIUS, 1, np.where(lateral < -OBSTACLE_RADIUS, -1, 0))
    return TaskScore(goal_error=goal_error, collided=collided, side=side)


# ---------------------------------------------------------------- observation image (policy_vision)

IMAGE_SIZE = 32  # pixels per side
IMAGE_EXTENT = 2.4  # the image covers [-IMAGE_EXTENT, IMAGE_EXTENT]^2 world units around the robot
IMAGE_CHANNELS = 2  # 0: goal (a Gaussian spot), 1: obstacle (an anti-aliased disk)
IMAGE_PIXEL = 2.0 * IMAGE_EXTENT / IMAGE_SIZE  # world units per pixel
GOAL_SPOT_SIGMA = 1.0  # pixels


def image_grid() -> tuple[np.ndarray, np.ndarray]:
    """World (x, y) of every pixel centre relative to the robot, float32 [SIZE, SIZE] each.

    Row 0 is the top of the image (largest y), column 0 the left (smallest x).
    """
    centres = (np.arange(IMAGE_SIZE, dtype=np.float64) + 0.5) * IMAGE_PIXEL - IMAGE_EXTENT
    gx = np.broadcast_to(centres[None, :], (IMAGE_SIZE, IMAGE_SIZE))
    gy = np.broadcast_to(-centres[:, None], (IMAGE_SIZE, IMAGE_SIZE))
    return gx.astype(np.float32), gy.astype(np.float32)


def render_observation(observations: np.ndarray) -> np.ndarray:
    """Top-down robot-centred render, uint8 [n, CHANNELS, SIZE, SIZE]: goal spot and obstacle.

    The robot sits at the image centre (not drawn); the goal is a Gaussian spot (sigma one
    pixel, peak 255) at goal - current, the obstacle a disk of OBSTACLE_RADIUS midway, with a
    one-pixel linear edge. Everything a camera-driven policy needs to plan the detour.
    """
    obs = observations.astype(np.float64)
    delta = obs[:, 2:] - obs[:, :2]
    gx, gy = (g.astype(np.float64) for g in image_grid())
    dx = gx[None] - delta[:, 0, None, None]
    dy = gy[None] - delta[:, 1, None, None]
    sigma = GOAL_SPOT_SIGMA * IMAGE_PIXEL
    goal = 255.0 * np.exp(-(dx * dx + dy * dy) / (2.0 * sigma * sigma))
    ox = gx[None] - 0.5 * delta[:, 0, None, None]
    oy = gy[None] - 0.5 * delta[:, 1, None, None]
    dist = np.sqrt(ox * ox + oy * oy)
    obstacle = 255.0 * np.clip((OBSTACLE_RADIUS - dist) / IMAGE_PIXEL + 0.5, 0.0, 1.0)
    image = np.stack([goal, obstacle], axis=1)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)
