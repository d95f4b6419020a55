"""The rollout side: collecting samples from the engine and scoring them (``collector``),
multi-turn episodes with environments and tools (``episodes``), and the plain data that flows
from rollout to learner (``batches``)."""
