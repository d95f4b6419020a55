"""Rollout engines (vLLM, the HF engine, pools of Ray rollout workers) behind one interface, and the
weight transports that carry the learner's weights to them."""
