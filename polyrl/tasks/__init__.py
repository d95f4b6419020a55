"""The shipped tasks: their data generators, splits and reward defaults (arithmetic, word problems,
scenes and captions, the calculator, the guessing game, drawing)."""
