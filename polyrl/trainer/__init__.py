"""The trainer: one arm assembled from its config and driven step by step.

Assembly (``arm``, ``build_data``, ``build_models``, ``build_rollout``), the synchronous and
asynchronous loops (``loop``, ``async_loop``, ``async_partitions``), the batch pipeline between
rollout and learner (``pipeline``), the loop's hooks and checkpoints (``hooks``,
``inspector_hook``, ``checkpoint``) and the typed seams between the loop and its collaborators
(``protocols``).
"""
