# SPDX-License-Identifier: Apache-2.0
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


def segment_distance(path: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Distance from each segment of polylines [n, k, 2] to a point per line [n, 2]: [n, k - 1].

    Segments, not only waypoints: a path that jumps across the obstacle between two waypoints
    collides."""
    a, b = path[:, :-1], path[:, 1:]
    seg = b - a
    seg_len2 = np.maximum((seg * seg).sum(axis=2), 1e-12)
    u = np.clip(((centre[:, None, :] - a) * seg).sum(axis=2) / seg_len2, 0.0, 1.0)
    closest = a + u[:, :, None] * seg
    return np.linalg.norm(closest - centre[:, None, :], axis=2)


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
    collided = (segment_distance(path, centre) < OBSTACLE_RADIUS).any(axis=1)
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


# ---------------------------------------------------------------- closed loop (policy_rtc)
#
# The task above scores one chunk planned from one observation. Executing chunks one after
# another, re-planning from wherever the robot got to (what real-time chunking is for), needs
# more: the obstacle stays where it is while the robot moves, so the observation carries it; and
# a demonstration is a path traversed in time, so that a chunk planned earlier and a chunk
# planned now agree on where the robot is due at each period. The demonstrator takes the
# shortest path to the goal that passes the obstacle on a chosen side at a clearance (straight
# where nothing is in the way); the rest of a shortest path is the shortest path from any point
# of it, so its chunks are consistent in time. It picks the side the robot already leans to, by
# a soft rule (on the line through obstacle and goal: 50/50), and its speed at random: speed and
# clearance are not observable, only a prefix of the chunk reveals them.
# An action is the displacement of one period (a velocity command), scaled to about one unit:
# the same in every frame, so a prefix cut from one chunk is already in the space of the next
# chunk's actions, and every row has the same statistics.

CL_OBS_DIM = 6  # [current_x, current_y, goal_x, goal_y, obstacle_x, obstacle_y]
CL_DISTANCE_RANGE = DISTANCE_RANGE  # |goal - start|
CL_CLEARANCE = (0.45, 0.5)  # radius around the obstacle's centre the demonstrations keep
CL_SPEED = (0.07, 0.12)  # distance per action period
CL_SIDE_SCALE = 0.05  # P(left) = sigmoid(lateral offset / CL_SIDE_SCALE)
CL_PERTURB = 0.03  # std of an observed position's offset from the path it was on
CL_AT_START = 0.3  # fraction of demonstrations observed at the episode's start
CL_ACTION_SCALE = 10.0  # an action is a period's displacement x this: steps of about one unit

CLOSED_LOOP_DESCRIPTION = (
    "Closed-loop detour: observation [current_x, current_y, goal_x, goal_y, obstacle_x, "
    f"obstacle_y]; start and goal as in the chunk task, the obstacle (radius {OBSTACLE_RADIUS}) "
    f"fixed midway between them for the episode. Action chunk: {ACTION_HORIZON} rows, each "
    f"period's displacement (dx, dy) x {CL_ACTION_SCALE:g}. Demonstrations: from a point of an "
    f"episode's way (off it by N(0, {CL_PERTURB}^2); {CL_AT_START:.0%} at the start), the "
    f"shortest path to the goal passing the obstacle at a clearance U{CL_CLEARANCE} on a side "
    f"chosen with P(left) = sigmoid(lateral / {CL_SIDE_SCALE}) (50/50 at the start), at "
    f"U{CL_SPEED} per period, resting at the goal."
)


def _unit(angle: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(angle), np.sin(angle)], axis=-1)


@dataclass(frozen=True)
class Detour:
    """The shortest path current -> goal keeping `radius` from the obstacle's centre on one
    side: a tangent segment, an arc, a tangent segment; or straight where the segment to the
    goal keeps the clearance anyway. One path per row, float64."""

    current: np.ndarray  # [n, 2]
    goal: np.ndarray
    obstacle: np.ndarray
    radius: np.ndarray  # [n] the clearance (at most the distance from current to the obstacle)
    turn: np.ndarray  # angular direction around the obstacle: -1 clockwise (passing on the left)
    angle1: np.ndarray  # where the arc starts
    arc: np.ndarray  # its angle
    blocked: np.ndarray  # bool: the straight segment would come closer than the clearance

    @classmethod
    def plan(cls, current, goal, obstacle, clearance, side) -> Detour:
        """side +1 passes the obstacle on the left of the way (clockwise), -1 on the right."""
        p, g, o = (np.asarray(a, np.float64) for a in (current, goal, obstacle))
        dp, dg = np.linalg.norm(p - o, axis=1), np.linalg.norm(g - o, axis=1)
        radius = np.maximum(np.minimum(np.asarray(clearance, np.float64), dp - 1e-9), 1e-9)
        turn = -np.asarray(side, np.float64)
        a1 = np.arctan2(p[:, 1] - o[:, 1], p[:, 0] - o[:, 0]) + turn * np.arccos(radius / dp)
        a2 = np.arctan2(g[:, 1] - o[:, 1], g[:, 0] - o[:, 0]) - turn * np.arccos(
            np.minimum(radius / dg, 1.0)
        )
        blocked = segment_distance(np.stack([p, g], axis=1), o)[:, 0] < radius
        arc = np.mod(turn * (a2 - a1), 2.0 * np.pi)
        return cls(p, g, o, radius, turn, a1, arc, blocked)

    def _tangent_points(self) -> tuple[np.ndarray, np.ndarray]:
        a2 = self.angle1 + self.turn * self.arc
        r = self.radius[:, None]
        return self.obstacle + r * _unit(self.angle1), self.obstacle + r * _unit(a2)

    @property
    def length(self) -> np.ndarray:
        t1, t2 = self._tangent_points()
        around = (
            np.linalg.norm(t1 - self.current, axis=1)
            + self.radius * self.arc
            + np.linalg.norm(self.goal - t2, axis=1)
        )
        return np.where(self.blocked, around, np.linalg.norm(self.goal - self.current, axis=1))

    def at(self, distance: np.ndarray) -> np.ndarray:
        """Positions [n, k, 2] at path lengths distance [n, k] (>= 0); beyond the end, the goal."""
        ell = np.asarray(distance, np.float64)
        p, g, o, r = self.current, self.goal, self.obstacle, self.radius[:, None]
        t1, t2 = self._tangent_points()
        len1 = np.linalg.norm(t1 - p, axis=1)[:, None]
        len_arc = r * self.arc[:, None]
        len2 = np.linalg.norm(g - t2, axis=1)[:, None]
        ell1 = ell - len1
        on1 = p[:, None] + (ell / np.maximum(len1, 1e-12))[..., None] * (t1 - p)[:, None]
        swept = self.angle1[:, None] + self.turn[:, None] * ell1 / r
        on_arc = o[:, None] + r[..., None] * _unit(swept)
        rest = np.minimum(ell1 - len_arc, len2) / np.maximum(len2, 1e-12)
        on2 = t2[:, None] + rest[..., None] * (g - t2)[:, None]
        around = np.where(
            (ell < len1)[..., None], on1, np.where((ell1 < len_arc)[..., None], on_arc, on2)
        )
        span = np.linalg.norm(g - p, axis=1)[:, None]
        straight = p[:, None] + (np.minimum(ell, span) / np.maximum(span, 1e-12))[..., None] * (
            g - p
        )[:, None]
        return np.where(self.blocked[:, None, None], around, straight)


def lateral_offset(position: np.ndarray, goal: np.ndarray, obstacle: np.ndarray) -> np.ndarray:
    """Signed distance [n] of positions from the line through obstacle and goal (the episode's
    start -> goal line): positive on its left."""
    axis = np.asarray(goal, np.float64) - obstacle
    rel = np.asarray(position, np.float64) - obstacle
    return (axis[:, 0] * rel[:, 1] - axis[:, 1] * rel[:, 0]) / np.linalg.norm(axis, axis=1)


def closed_loop_observation(
    current: np.ndarray, goal: np.ndarray, obstacle: np.ndarray
) -> np.ndarray:
    """[current, goal, obstacle] as float32 [n, CL_OBS_DIM]."""
    return np.concatenate([current, goal, obstacle], axis=1).astype(np.float32)


def closed_loop_starts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Episode starts, float32 [n, CL_OBS_DIM]: start uniform in [-1, 1]^2, the goal
    U(CL_DISTANCE_RANGE) away in a uniform direction, the obstacle midway."""
    start = rng.uniform(-1.0, 1.0, size=(n, 2))
    heading = rng.uniform(0.0, 2.0 * np.pi, size=n)
    dist = rng.uniform(*CL_DISTANCE_RANGE, size=n)
    goal = start + dist[:, None] * np.stack([np.cos(heading), np.sin(heading)], axis=1)
    return closed_loop_observation(start, goal, 0.5 * (start + goal))


def closed_loop_actions(positions: np.ndarray) -> np.ndarray:
    """Actions float32 [n, HORIZON * DIM] that move through positions [n, HORIZON + 1, 2] (the
    current one first): each period's displacement x CL_ACTION_SCALE."""
    steps = np.diff(np.asarray(positions, np.float64), axis=1) * CL_ACTION_SCALE
    return steps.reshape(len(steps), -1).astype(np.float32)


def closed_loop_positions(current: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Positions [n, k, 2] the robot reaches executing actions [n, k * DIM] from current [n, 2]
    (accumulated in float64)."""
    steps = np.asarray(actions, np.float64).reshape(len(current), -1, ACTION_DIM)
    return np.asarray(current, np.float64)[:, None] + np.cumsum(steps, axis=1) / CL_ACTION_SCALE


def closed_loop_demonstrations(
    rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """(observations float32 [n, CL_OBS_DIM], actions float32 [n, HORIZON * DIM]) from any
    point of the way: an episode, the demonstrator's path from its start (random side), a
    uniform point along it (CL_AT_START of them the start itself) moved off it by CL_PERTURB,
    and the demonstrator's next HORIZON steps from there."""
    starts = closed_loop_starts(rng, n).astype(np.float64)
    start, goal, obstacle = starts[:, :2], starts[:, 2:4], starts[:, 4:]
    clearance = rng.uniform(*CL_CLEARANCE, size=n)
    speed = rng.uniform(*CL_SPEED, size=n)
    side = rng.choice(np.array([-1.0, 1.0]), size=n)
    way = Detour.plan(start, goal, obstacle, clearance, side)
    at = rng.uniform(0.0, 1.0, size=n) * way.length
    at_start = rng.uniform(size=n) < CL_AT_START
    at[at_start] = 0.0
    current = way.at(at[:, None])[:, 0]
    current += np.where(at_start[:, None], 0.0, rng.normal(0.0, CL_PERTURB, size=(n, 2)))
    lean = lateral_offset(current, goal, obstacle) / CL_SIDE_SCALE
    left = rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-lean))
    side = np.where(at_start, side, np.where(left, 1.0, -1.0))
    rows = np.arange(0, ACTION_HORIZON + 1, dtype=np.float64)[None, :] * speed[:, None]
    positions = Detour.plan(current, goal, obstacle, clearance, side).at(rows)
    return closed_loop_observation(current, goal, obstacle), closed_loop_actions(positions)


def chunk_side(points: np.ndarray, goal: np.ndarray, obstacle: np.ndarray) -> np.ndarray:
    """Which side of the obstacle positions [n, k, 2] pass: +1 left, -1 right (of the episode's
    start -> goal line), 0 for chunks that do not pass it. The mean lateral offset of the rows
    beside the obstacle (within 0.2 of the way from it, along the line), against half the
    obstacle's radius."""
    p = np.asarray(points, np.float64)
    axis = 2.0 * (goal - obstacle)  # start -> goal
    rel = p - obstacle[:, None, :]
    along = (rel * axis[:, None, :]).sum(axis=2) / (axis * axis).sum(axis=1)[:, None]
    lateral = (axis[:, None, 0] * rel[..., 1] - axis[:, None, 1] * rel[..., 0]) / np.linalg.norm(
        axis, axis=1
    )[:, None]
    beside = np.abs(along) <= 0.2
    count = beside.sum(axis=1)
    mean = np.where(count > 0, (lateral * beside).sum(axis=1) / np.maximum(count, 1), 0.0)
    half = 0.5 * OBSTACLE_RADIUS
    return np.where(mean > half, 1, np.where(mean < -half, -1, 0))
