"""The HTTP layer: the only part of dpgate that imports Flask."""
