"""The HTTP edge: the quart-trio app, its routes, and the streaming response body."""
