"""What every layer shares: the error base class, plain data types of a rollout, console helpers,
folders, plugins and the loading of user code from explicit references."""
