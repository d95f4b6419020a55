"""The experiment YAML as typed pydantic models, one module per section, with the loading, overrides,
presets and the refusals of settings that would do nothing."""
