"""The stages a policy composes: admit -> order -> reserve -> backfill -> reclaim -> place -> explain.

Each module holds one stage (a frozen dataclass with its parameters and the functions that act
on a `round.Round`); `compose.Composition` names the stages of one policy and `compose.plan_with`
runs them.  ``policies/`` holds the four compositions: ``fifo``, ``easy``, ``static``, ``berth``.

* `admit`: whether a job may be considered at all, and whether it may run only lent
  (quota guarantees, the interactive pool's forecast peak);
* `order`: the queue order (arrival, multifactor priority, expected slowdown);
* `reserve`: bookings' GPUs and holds, the interactive pool's hold, the top job's shadow;
* `backfill`: the passes over the queue (strict arrival order, EASY, EASY on two partitions);
* `reclaim`: taking consenting work back for bookings, sessions, quota claims and the top job;
* `place`: choosing GPUs for one job and starting it (normal or lent);
* `explain`: freezing the round into a `Plan` with reasons (`scheduling.engine.explain`);
* `partition`: static's interactive partition and the batch jobs wider than the rest.
"""
