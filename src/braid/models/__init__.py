"""Models braid can build locally (no model hub is needed)."""
